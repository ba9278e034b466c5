"""Per-account tokens end to end: a real daemon, HTTP and the CLI. An account token
sees and spends only its own account; the admin token does everything; a revoked
token stops working; tokens survive a restart."""

from __future__ import annotations

import pytest

from controller.client import ClientError
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
