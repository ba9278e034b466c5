"""Per-account tokens end to end: a real daemon, HTTP and the CLI. An account token
sees and spends only its own account; the admin token does everything; a revoked
token stops working; tokens survive a restart."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from controller.cli.client import ClientError
from tests.conftest import wait_for_bag
from tests.integration.test_cli import spotbag

pytestmark = pytest.mark.integration


def _refused(call, *args, **kwargs) -> ClientError:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_an_account_token_sees_and_spends_only_its_account(make_daemon):
    daemon = make_daemon()
    admin = daemon.start()
    admin.create_account("lab", cpu_hours=10)
    admin.create_account("other", cpu_hours=10)
    theirs = admin.submit(
        {"account": "other", "command": "true", "parameters": {"i": [1]}, "max_runtime_s": 60}
    )

    issued = spotbag(
        "accounts", "token", "create", "lab", "--note", "ci", state_dir=daemon.state_dir
    )
    token = issued.stdout.strip()
    assert token.startswith("sbt_") and "not shown again" in issued.stderr
    lab = daemon.client(token)

    # The account may go unsaid: the bag is charged to the token's account.
    ours = lab.submit({"command": "echo {i}", "parameters": {"i": [1, 2]}, "max_runtime_s": 60})
    assert ours["account"] == "lab"
    assert wait_for_bag(lab, ours["id"], 30)["state"] == "succeeded"
    assert lab.job(f"{ours['id']}-0")["state"] == "succeeded"
    assert lab.log(f"{ours['id']}-1")[0].strip() == b"2"
    assert [b["id"] for b in lab.bags()] == [ours["id"]]
    assert lab.account("lab")["charged_cpu_h"] > 0
    assert [a["account"] for a in lab.accounts()["accounts"]] == ["lab"]
    assert lab.ledger("lab")["entries"]

    # Another account's bags do not exist for this token; its account is forbidden.
    assert _refused(lab.bag, theirs["id"]).status == 404
    assert _refused(lab.job, f"{theirs['id']}-0").status == 404
    assert _refused(lab.cancel, theirs["id"]).status == 404
    spent = _refused(lab.submit, {"account": "other", "command": "true", "max_runtime_s": 60})
    assert spent.status == 403 and "may not use account 'other'" in spent.message
    assert _refused(lab.account, "other").status == 403
    assert _refused(lab.ledger, "other").status == 403
    # Admin-only routes.
    for call, args in (
        (lab.credit, ("lab", 5)),
        (lab.create_account, ("mine",)),
        (lab.create_token, ("lab",)),
        (lab.vms, ()),
    ):
        error = _refused(call, *args)
        assert error.status == 403 and error.code == "forbidden", (call, error)
    assert admin.account("lab")["allocation_cpu_h"] == 10  # the refused credit did nothing
    # A wrong secret with a real id is as good as no token.
    token_id = token.split("_")[1]
    assert _refused(daemon.client(f"sbt_{token_id}_{'x' * 43}").bags).status == 401

    # Tokens survive a restart; the list never shows secrets; revoking is immediate.
    daemon.stop()
    admin = daemon.start()
    lab = daemon.client(token)
    assert lab.account("lab")["account"] == "lab"
    listed = lab.tokens("lab")["tokens"]
    assert [t["id"] for t in listed] == [token_id] and "token" not in listed[0]
    spotbag("accounts", "token", "revoke", "lab", token_id, state_dir=daemon.state_dir)
    assert _refused(lab.bags).status == 401
    assert admin.tokens("lab")["tokens"][0]["revoked_at"] is not None
    assert _refused(admin.revoke_token, "lab", token_id).status == 409


def _post_bag(client, body: dict, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        client.url + "/v1/bags",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {client.token}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_idempotency_keys_are_each_accounts_own(make_daemon):
    """The same Idempotency-Key from two accounts makes two bags; a replay returns the
    account's own bag; nothing an account is told names the other account's bag."""
    daemon = make_daemon()
    admin = daemon.start()
    for name in ("lab", "other"):
        admin.create_account(name, cpu_hours=10)
    lab = daemon.client(admin.create_token("lab")["token"])
    other = daemon.client(admin.create_token("other")["token"])
    spec = {"command": "true", "max_runtime_s": 60}

    status, theirs = _post_bag(other, spec, "nightly")
    assert status == 201 and theirs["account"] == "other"
    answers = []
    status, ours = _post_bag(lab, spec, "nightly")  # the same key, another account
    answers.append(ours)
    assert status == 201 and ours["account"] == "lab" and ours["id"] != theirs["id"]
    status, again = _post_bag(lab, spec, "nightly")  # a retry: the account's own bag
    answers.append(again)
    assert status == 200 and again["id"] == ours["id"]
    status, conflict = _post_bag(lab, {**spec, "command": "false"}, "nightly")
    answers.append(conflict)
    assert status == 409 and conflict["error"]["code"] == "idempotency_key_reused"
    assert conflict["error"]["detail"]["bag_id"] == ours["id"]
    # A key only the other account used is free for this one (no squatting).
    status, theirs_next = _post_bag(other, spec, "tomorrow")
    assert status == 201
    status, ours_next = _post_bag(lab, {**spec, "command": "echo mine"}, "tomorrow")
    answers.append(ours_next)
    assert status == 201 and ours_next["id"] != theirs_next["id"]
    # The admin submitting for an account uses that account's keys.
    status, replayed = _post_bag(admin, {**spec, "account": "other"}, "nightly")
    assert status == 200 and replayed["id"] == theirs["id"]
    for answer in answers:
        text = json.dumps(answer)
        assert theirs["id"] not in text and theirs_next["id"] not in text, answer
    assert {b["id"] for b in lab.bags()} == {ours["id"], ours_next["id"]}
