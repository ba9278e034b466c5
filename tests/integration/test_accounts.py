"""Accounts end to end: a real daemon, its HTTP API and the CLI. A bag the account cannot
cover is refused with the numbers (402); a held bag runs as far as its CPU-hours go
and finishes once the account is credited; balances and the ledger add up."""

from __future__ import annotations

import csv
import io
import json

import pytest

from controller.cli.client import ClientError
from tests.conftest import wait_for_bag, wait_until
from tests.integration.test_cli import spotbag


def test_reserve_refuse_hold_credit_and_the_ledger(make_daemon):
    daemon = make_daemon()
    client = daemon.start()
    spotbag("accounts", "create", "lab", "--cpu-hours", "2", state_dir=daemon.state_dir)
    created = client.account("lab")
    assert created["allocation_cpu_h"] == 2.0 and created["available_cpu_h"] == 2.0
    spec = {
        "account": "lab",
        "command": "sleep 3",
        "parameters": {"i": [1, 2, 3]},
        "max_runtime_s": 3600,  # 1 CPU-hour reserved per job
    }
    with pytest.raises(ClientError) as refused:
        client.submit(spec)
    error = refused.value
    assert error.status == 402 and error.code == "insufficient_balance"
    assert error.detail["needed_cpu_h"] == 3.0 and error.detail["available_cpu_h"] == 2.0
    assert "needs 3.00" in error.message and "has 2.00 available" in error.message
    assert client.bags() == []  # nothing admitted
    cli = spotbag(
        "submit", "-", state_dir=daemon.state_dir, input_text=json.dumps(spec), check=False
    )
    assert cli.returncode == 2 and "needs 3.00" in cli.stderr

    bag = client.submit(dict(spec, on_insufficient_balance="hold"))
    assert bag["counts"]["queued"] == 2 and bag["counts"]["held"] == 1

    balance = client.account("lab")
    assert balance["held_jobs"] == 1 and balance["reserved_cpu_h"] == 2.0
    assert balance["available_cpu_h"] == 0.0
    # Credit while the two covered jobs still run: the held one starts at once.
    spotbag("accounts", "credit", "lab", "1", "--note", "top-up", state_dir=daemon.state_dir)

    def all_running() -> bool:
        return client.bag(bag["id"])["counts"]["running"] == 3

    wait_until(all_running, 2.5, 0.05, "the held job to start beside the others")
    done = wait_for_bag(client, bag["id"], 30)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 3

    balance = client.account("lab")
    assert balance["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-9)
    jobs = client.jobs(bag["id"])["jobs"]
    attempts = [a for j in jobs for a in client.job(j["id"])["attempt_list"]]
    used_h = sum(a["ended_at"] - a["started_at"] for a in attempts) / 3600
    assert balance["charged_cpu_h"] == pytest.approx(used_h, abs=1e-9)
    assert balance["allocation_cpu_h"] == 3.0
    assert balance["available_cpu_h"] == pytest.approx(3.0 - used_h, abs=1e-9)

    out = spotbag("accounts", "ledger", "lab", "--csv", state_dir=daemon.state_dir).stdout
    entries = list(csv.DictReader(io.StringIO(out)))
    kinds = [e["kind"] for e in entries]
    assert kinds.count("credit") == 2 and kinds.count("reserve") == 3
    assert kinds.count("charge") == 3 and kinds.count("release") == 3
    assert [e["note"] for e in entries if e["kind"] == "credit"][-1] == "top-up"
    shown = spotbag("accounts", "list", state_dir=daemon.state_dir).stdout
    assert "lab" in shown
    exists = spotbag("accounts", "create", "lab", state_dir=daemon.state_dir, check=False)
    assert exists.returncode == 2 and "exists already" in exists.stderr
    missing = spotbag("accounts", "credit", "nobody", "5", state_dir=daemon.state_dir, check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
