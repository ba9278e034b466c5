"""kill -9 the daemon at random moments while a bag runs with preemptions; restart it
each time. At the end every job has succeeded, the bag's usage counts every attempt the
store recorded, and the account's ledger agrees exactly with them: each reservation made once and settled once,
charges = rate × the time of every ended attempt, nothing left reserved, and the
account's balance adds up."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.conftest import wait_for_bag, wait_until
from tests.controller.simworld import rows
from tests.controller.test_ledger_in_scheduler import check_ledger

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_at_random_moments_loses_no_job_and_charges_exactly_the_recorded_usage(
    make_daemon, seed
):
    # VMs live 2 model hours on average, one model hour per real second: a job of
    # 1-2 s is preempted now and then, and so are the daemons' VMs across kills.
    daemon = make_daemon(model="exponential", mttf_h=2.0, time_scale=3600.0, max_vms=3)
    client = daemon.start()
    client.create_account("lab", cpu_hours=50)
    bag = client.submit(
        {
            "account": "lab",
            "command": "sleep 1.{i}",
            "parameters": {"i": list(range(10)) * 2},
            "max_runtime_s": 600,  # reserves 1/6 CPU-hour per attempt
            "max_attempts": 30,
        }
    )
    chance = random.Random(seed)
    for kill in range(4):
        time.sleep(chance.uniform(0.3, 2.5))
        if kill == 0:
            # Whatever the kills hit, one preemption certainly cuts attempts short.
            busy = wait_until(
                lambda c=client: [vm for vm in c.vms()["vms"] if vm["jobs"]], 30, 0.05, "a busy VM"
            )
            client.preempt(busy[0]["id"])
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        client = daemon.start()
    done = wait_for_bag(client, bag["id"], 120)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 20
    balance = client.account("lab")
    assert daemon.stop() == 0

    state = daemon.state_dir
    assert rows(state, "SELECT count(*) FROM attempts WHERE ended_at IS NULL") == [(0,)]
    interrupted = rows(state, "SELECT count(*) FROM attempts WHERE state IN ('preempted', 'lost')")[
        0
    ][0]
    assert interrupted > 0  # the run did see preemptions or crashes cut attempts short
    # The bag's usage counts every attempt the store has, also those that ended
    # while the daemon was down (their VMs were gone by the restart).
    usage = rows(state, "SELECT attempts_ended, attempt_s FROM bags")
    stored = rows(state, "SELECT count(*), sum(ended_at - started_at) FROM attempts")
    assert usage[0][0] == stored[0][0]
    assert usage[0][1] == pytest.approx(stored[0][1], rel=1e-9)
    sums = check_ledger(state)  # once each, charges = rate × recorded time, none open
    used = rows(state, "SELECT sum(ended_at - started_at) / 3600.0 FROM attempts")[0][0]
    assert sums["charge"] == pytest.approx(used, rel=1e-9)
    assert balance["charged_cpu_h"] == pytest.approx(used, rel=1e-9)
    assert balance["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-9)
    assert balance["allocation_cpu_h"] == pytest.approx(
        balance["charged_cpu_h"] + balance["reserved_cpu_h"] + balance["available_cpu_h"]
    )
