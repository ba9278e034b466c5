"""kill -9 the daemon at random moments while a bag runs with preemptions; restart it
each time. At the end every job has succeeded, the bag's usage counts every attempt the
store recorded, and the account's ledger agrees exactly with them: each reservation made once and settled once,
charges = rate × the time of every ended attempt, nothing left reserved, and the
account's balance adds up.

Two of the kills are aimed (the daemon frozen with SIGSTOP while the store is looked
at, then killed): one while an attempt is recorded as starting and its program has not
been started (its log does not exist yet), and one while an attempt's program runs
that the store has not recorded as running. The first is charged nothing (it used
nothing: the controller's downtime was charged to such attempts, issue 23); the
second, whose program ends while the daemon is down, is charged the time it ran."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Daemon, wait_for_bag, wait_until
from tests.controller.simworld import rows
from tests.controller.test_ledger_in_scheduler import check_ledger

pytestmark = pytest.mark.integration

HOUR = 3600.0


def not_running_yet(state_dir: Path) -> list[tuple[str, Path]]:
    """(reservation key, log path) of the live attempts the store has not recorded as
    running (ran_at NULL). Read-only, and quick to give up while the daemon writes."""
    try:
        with sqlite3.connect(
            f"file:{state_dir / 'spotbag.db'}?mode=ro", uri=True, timeout=0.05
        ) as conn:
            found = conn.execute(
                "SELECT bag_id || ':' || idx || ':' || number, log_path FROM attempts "
                "WHERE ended_at IS NULL AND ran_at IS NULL"
            ).fetchall()
    except sqlite3.OperationalError:  # locked, or not created yet
        return []
    return [(key, Path(log)) for key, log in found if log]


def frozen(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def kill_when(
    daemon: Daemon, wanted: Callable[[Path], bool], timeout_s: float = 60.0
) -> list[tuple[str, Path]]:
    """SIGKILL the daemon at a moment its store shows live attempts not recorded as
    running whose log passes `wanted`: whenever the store shows some, freeze the daemon
    (SIGSTOP), look again while it can change nothing, and kill it if they are still
    there, else let it go on. Returns those attempts."""
    assert daemon.process is not None
    pid = daemon.process.pid
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(wanted(log) for _, log in not_running_yet(daemon.state_dir)):
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: frozen(pid), 5, 0.001, "the daemon frozen")
            found = [(key, log) for key, log in not_running_yet(daemon.state_dir) if wanted(log)]
            if found:
                os.kill(pid, signal.SIGKILL)
                assert daemon.process.wait(10) == -signal.SIGKILL
                return found
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError(f"no attempt as wanted within {timeout_s} s")


def not_started(log: Path) -> bool:
    return not log.exists()  # the executor opens the log just before it starts the program


def program_began(log: Path) -> bool:
    return log.exists() and log.stat().st_size > 0  # the command's first `echo` ran


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
            "command": "echo began; sleep 1.{i}",
            "parameters": {"i": list(range(10)) * 3},
            "max_runtime_s": 600,  # reserves 1/6 CPU-hour per attempt
            "max_attempts": 30,
        }
    )
    chance = random.Random(seed)
    never_started: list[str] = []
    unrecorded: list[str] = []
    for kill in range(4):
        if kill == 1:
            never_started = [key for key, _ in kill_when(daemon, not_started)]
        elif kill == 2:
            found = kill_when(daemon, program_began)
            unrecorded = [key for key, _ in found]
            # Down until those programs have ended (their wrapper wrote the exit status).
            for _, log in found:
                wait_until(log.with_suffix(".exit").exists, 30, 0.05, f"{log} to end")
        else:
            time.sleep(chance.uniform(0.3, 2.5))
            if kill == 0:
                # Whatever the kills hit, one preemption certainly cuts attempts short.
                busy = wait_until(
                    lambda c=client: [vm for vm in c.vms()["vms"] if vm["jobs"]],
                    30,
                    0.05,
                    "a busy VM",
                )
                client.preempt(busy[0]["id"])
            assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        client = daemon.start()
    done = wait_for_bag(client, bag["id"], 180)
    assert done["state"] == "succeeded" and done["counts"]["succeeded"] == 30
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

    # Charged = the time of the attempts whose program ran × their rate; the others 0.
    charges = dict(rows(state, "SELECT key, cpu_h FROM ledger WHERE kind = 'charge'"))
    ran_h = 0.0
    ran, not_ran = [], []
    for key, started_at, ran_at, ended_at, spec in rows(
        state,
        "SELECT a.bag_id || ':' || a.idx || ':' || a.number, a.started_at, a.ran_at, "
        "a.ended_at, b.spec FROM attempts a JOIN bags b ON b.id = a.bag_id",
    ):
        resources = json.loads(spec)["resources"]
        rate = resources["cpus"] + 20 * resources["gpus"]
        if ran_at is None:  # it never ran: no time, no charge
            not_ran.append(key)
            assert ended_at == started_at, key
            assert charges.get(key, 0.0) == 0.0, key
        else:  # it ran from its start (the local executor starts programs at once)
            ran.append(key)
            assert ran_at == started_at, key
            ran_h += rate * (ended_at - ran_at) / HOUR
    # The aimed kills did what they aimed at: never-started attempts, charged nothing,
    # and programs that ran unrecorded, charged the time they ran (about 1-2 s).
    assert never_started and set(never_started) <= set(not_ran), (never_started, not_ran)
    assert unrecorded and set(unrecorded) <= set(ran), (unrecorded, ran)
    assert all(charges[key] > 0.9 / HOUR for key in unrecorded), [charges[k] for k in unrecorded]
    print(
        f"\nkill -9 bag (seed {seed}): {len(ran) + len(not_ran)} attempts; {len(ran)} ran, "
        f"charged {sums['charge']:.6f} CPU-h = their run time × rate {ran_h:.6f} CPU-h; "
        f"{len(not_ran)} never started (at the aimed kill: {len(never_started)}), charged "
        f"{sum(charges.get(key, 0.0) for key in not_ran):.6f} CPU-h; programs that ran "
        f"unrecorded at a kill: {len(unrecorded)}, charged "
        f"{sum(charges[key] for key in unrecorded) * HOUR:.2f} CPU-s"
    )
    assert sums["charge"] == pytest.approx(ran_h, rel=1e-9)
    assert balance["charged_cpu_h"] == pytest.approx(ran_h, rel=1e-9)
    assert balance["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-9)
    assert balance["allocation_cpu_h"] == pytest.approx(
        balance["charged_cpu_h"] + balance["reserved_cpu_h"] + balance["available_cpu_h"]
    )
