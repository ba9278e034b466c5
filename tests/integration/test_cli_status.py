"""`spotbag status` imports only the HTTP client (issue 24: it paid 0.3 s of CPU for
scipy, pydantic and rich), and says what README says it says; `spotbag cancel` of a
cancelled bag is a no-op."""

from __future__ import annotations

import os
import subprocess

import pytest

from controller.formatting import usd
from tests.conftest import run_cli_recording_modules, wait_for_bag, wait_until

pytestmark = pytest.mark.integration

# Nothing `status` prints needs these (rich.console: its tables are plain text).
NOT_FOR_STATUS = ("numpy", "scipy", "pydantic", "matplotlib", "yaml", "sqlite_utils", "aiohttp")


def spotbag(client, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`spotbag ARGS` run against the daemon of `client`, and the modules it imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
    daemon = ["--url", client.url, "--token", client.token]
    return run_cli_recording_modules(tmp_path, *daemon, *args, env=env)


def test_status_imports_the_client_only_and_prints_the_fleet_line(make_daemon, tmp_path):
    client = make_daemon().start()
    bag = client.submit({"account": "a", "command": "true", "max_runtime_s": 30, "name": "one"})
    wait_for_bag(client, bag["id"])

    listing, listing_modules = spotbag(client, tmp_path, "status")
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()
    assert header.split() == [
        "bag",
        "name",
        "state",
        "done",
        "succeeded",
        "failed",
        "running",
        "queued",
        "interrupted",
        "spot",
        "cost",
        "flag",
    ]
    # Percentages print as every figure does (controller/formatting.py): "100 %".
    assert row.split()[:6] == [bag["id"], "one", "succeeded", "100", "%", "1"]
    one, one_modules = spotbag(client, tmp_path, "status", bag["id"])
    assert one.returncode == 0, one.stderr
    # README's summary, with the fleet's line that `watch` ends with too.
    assert one.stdout.startswith(f"bag {bag['id']} (one): succeeded after")
    assert "\n  all VMs     1 VMs of every bag so far, 0 of them preempted: " in one.stdout
    for modules in (listing_modules, one_modules):
        assert "controller.cli.client" in modules and "controller.cli.status" in modules
        heavy = {m for m in modules if m.split(".")[0] in NOT_FOR_STATUS or m == "rich.console"}
        assert not heavy, heavy
        assert not {m for m in modules if m.startswith("controller.cli.bags")}


def test_status_shows_budget_used_against_the_caps_and_flags_a_held_bag(make_daemon, tmp_path):
    client = make_daemon().start()
    body = {"name": "lab", "unlimited": True, "budget_usd": 7}
    client.request("POST", "/v1/accounts", body=body)
    spec = {"account": "lab", "command": "true", "max_runtime_s": 7200, "name": "capped"}
    # Half a local-2 VM for 2 h reserves $0.02: a cap of $0.01 holds the bag at once.
    bag = client.submit({**spec, "budget_usd": 0.01, "deadline": "10h"})
    # Long enough to cost more than formatting.NOISE (`true` can cost less: zero by rule).
    free = client.submit({**spec, "name": "free", "command": "sleep 0.5"})
    wait_until(lambda: client.bag(bag["id"])["budget"]["held"], 30, 0.1, "the budget to hold it")
    wait_for_bag(client, free["id"])

    listing, modules = spotbag(client, tmp_path, "status")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert rows[bag["id"]].endswith("  held: budget")
    assert not rows[free["id"]].endswith("budget")  # ended: no flag
    one, one_modules = spotbag(client, tmp_path, "status", bag["id"])
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    # The account's month holds what the free bag cost: a few millionths of a dollar,
    # printed as such (never $0.00).
    month = client.bag(bag["id"])["budget"]["account_month_charged_usd"]
    assert month > 0
    assert (
        "  budget      $0.00 charged + $0.00 reserved of $0.01 (0 % used)"
        f" (account: {usd(month)} of $7.00 this month)"
    ) in lines, one.stdout
    assert "$0.00 of $7.00" not in one.stdout
    assert any(line.startswith("  waiting     held: budget: bag ") for line in lines)
    view = client.bag(bag["id"])
    deadline = next(line for line in lines if line.startswith("  deadline    "))
    assert deadline.endswith("(10h), on-demand when_needed, confidence 0.95")
    # The projection's lines come with the API's `deadline` (the deadline policy's), and
    # only with it: a daemon without the policy prints the deadline alone.
    projected = any(line.startswith("  time left   ") for line in lines)
    assert projected == bool(view.get("deadline")), one.stdout
    for loaded in (modules, one_modules):
        assert not {m for m in loaded if m.split(".")[0] in NOT_FOR_STATUS}


def test_cancelling_a_cancelled_bag_is_a_no_op_that_says_so(make_daemon, tmp_path):
    client = make_daemon().start()
    bag = client.submit({"account": "a", "command": "sleep 30", "max_runtime_s": 60})
    first, _ = spotbag(client, tmp_path, "cancel", bag["id"])
    assert first.returncode == 0 and first.stdout.startswith(f"cancelling bag {bag['id']}")
    assert wait_for_bag(client, bag["id"])["state"] == "cancelled"
    again, _ = spotbag(client, tmp_path, "cancel", bag["id"])
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"bag {bag['id']} is already cancelled: nothing to do\n"
    # A bag that ended otherwise cannot be cancelled: that is still refused.
    done = client.submit({"account": "a", "command": "true", "max_runtime_s": 30})
    wait_for_bag(client, done["id"])
    refused, _ = spotbag(client, tmp_path, "cancel", done["id"])
    assert refused.returncode == 2
    assert f"bag {done['id']} already finished (succeeded)" in refused.stderr
