"""Which spotbag account a Slurm user's pool job pays from, and what becomes of an
account spotbag does not know (issue 22): never "(null)" (what Slurm says without
slurmdbd), never an account created unlimited from Slurm's input.

The refusal path (a job cancelled, the reason in its comment) and the "create" option
are run on real Slurm in tests/integration/test_slurm_power_saving.py; here the real
scheduler and store (the sim world) take what is hard to make happen there: the end of a
run whose start was never reported (its prolog callback lost), the start of a run whose
last run's end never came, when an end is answered, a pool VM lost in a restart, and
reservations in "create" mode."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from controller.clock import RealClock, SimClock
from controller.config import SlurmPoolConfig
from controller.errors import ApiError
from controller.executors.sim import SimExecutor
from controller.scheduler.inputs import PoolRunEvent
from controller.slurm import events
from controller.slurm.callbacks import SlurmEvent
from controller.slurm.pools import PoolBook, run_account
from tests.controller.simworld import config, rows, world


@pytest.mark.parametrize(
    ("account", "user", "name", "by_user"),
    [
        ("(null)", "alice", "alice", True),  # no slurmdbd: Slurm's word for none
        ("", "alice", "alice", True),
        ("  ", "alice", "alice", True),
        ("chem", "alice", "chem", False),  # an account given (-A) is the account
        ("(null)", "(null)", "", True),  # nothing to go by
        ("", "", "", True),
    ],
)
def test_the_account_is_the_jobs_or_else_its_users(account, user, name, by_user):
    matched = run_account(account, user)
    assert (matched.name, matched.by_user) == (name, by_user)


def test_the_reason_says_what_was_looked_for_and_what_would_help():
    assert run_account("(null)", "nobody").unknown() == (
        "Slurm user nobody has no spotbag account (account '(null)' given, matched by user "
        "name); an admin creates it with `spotbag accounts create nobody --cpu-hours N`"
    )
    assert "(no account given, matched by user name)" in run_account("", "bob").unknown()
    assert run_account("chem", "bob").unknown() == (
        "Slurm account 'chem' of user bob is not a spotbag account; an admin creates it "
        "with `spotbag accounts create chem --cpu-hours N`"
    )
    assert "cannot be one" in run_account("a b", "bob").unknown()
    assert "neither an account nor a user name" in run_account("(null)", "").unknown()


def test_unknown_accounts_are_created_only_when_configured_and_only_with_a_name():
    cancel = PoolBook((), ())
    create = PoolBook((), (), unknown_accounts="create", unknown_account_cpu_h=5.0)
    assert cancel.credit_for_unknown(run_account("(null)", "alice")) is None
    assert create.credit_for_unknown(run_account("(null)", "alice")) == 5.0
    assert create.credit_for_unknown(run_account("(null)", "")) is None
    assert create.credit_for_unknown(run_account("bad name", "alice")) is None


async def pool_world(tmp_path, clock: SimClock | None = None, **unknown):
    cfg = config()
    scheduler = await world(tmp_path, clock or SimClock(1000.0), 1, cfg)
    pool = SlurmPoolConfig(partition="spot", nodes="spot-[0-1]", vm_types=("small",))
    scheduler.pools = PoolBook([pool], cfg.catalog(), **unknown)
    return scheduler


async def take(scheduler, event: PoolRunEvent) -> str | None:
    """One pass with the event; its verdict."""
    verdict = scheduler.pool_run(event)
    assert verdict is not None
    await scheduler.tick()
    return verdict.result() if verdict.done() else None


def lost_start_end(job_id: str, user: str, account: str = "(null)") -> PoolRunEvent:
    """A jobcomp whose prolog callback never arrived: 2 CPUs for 1800 s."""
    return PoolRunEvent(
        "end",
        job_id,
        "job",
        "spot",
        "spot-0",
        user=user,
        account=account,
        cpus=2,
        state="COMPLETED",
        exit_code=0,
        started_at=100.0,
        ended_at=1900.0,
    )


async def test_a_run_whose_start_was_lost_is_kept_uncharged_when_its_account_is_unknown(
    tmp_path,
):
    scheduler = await pool_world(tmp_path)
    await take(scheduler, lost_start_end("41", "alice"))
    await scheduler.store.flush()
    ((account, user, state, reason),) = rows(
        tmp_path, "SELECT account, user, state, reason FROM slurm_runs"
    )
    assert (account, user, state) == ("alice", "alice", "succeeded")
    assert reason.startswith("its start was not reported, and Slurm user alice has no")
    assert reason.endswith(": 1 CPU-hours not charged")
    assert rows(tmp_path, "SELECT name FROM accounts") == []
    assert rows(tmp_path, "SELECT count(*) FROM ledger") == [(0,)]
    assert not scheduler.accounts.exists("alice") and not scheduler.accounts.exists("(null)")


async def test_a_run_whose_start_was_lost_is_charged_to_its_users_account(tmp_path):
    scheduler = await pool_world(tmp_path)
    scheduler.accounts.create("alice", False, 10.0, 0.0)
    await take(scheduler, lost_start_end("42", "alice"))
    await scheduler.store.flush()
    assert rows(tmp_path, "SELECT account, reason FROM slurm_runs") == [
        ("alice", "its start was not reported")
    ]
    assert scheduler.accounts.view("alice")["charged_cpu_h"] == pytest.approx(1.0)
    assert rows(tmp_path, "SELECT DISTINCT account FROM ledger") == [("alice",)]


async def test_create_opens_a_limited_account_with_its_credit(tmp_path):
    scheduler = await pool_world(tmp_path, unknown_accounts="create", unknown_account_cpu_h=5.0)
    start = PoolRunEvent(
        "start", "43", "job", "spot", "spot-0", user="bob", account="(null)", cpus=2, limit_h=1.0
    )
    assert await take(scheduler, start) == "reserved"
    await take(scheduler, lost_start_end("44", "carol"))  # at its end, the same rule
    await scheduler.store.flush()
    assert rows(tmp_path, "SELECT name, unlimited FROM accounts ORDER BY name") == [
        ("bob", 0),
        ("carol", 0),
    ]
    bob = scheduler.accounts.view("bob")
    assert (bob["allocation_cpu_h"], bob["reserved_cpu_h"]) == (5.0, 2.0)
    carol = scheduler.accounts.view("carol")
    assert (carol["allocation_cpu_h"], carol["charged_cpu_h"]) == (5.0, pytest.approx(1.0))
    assert not scheduler.accounts.exists("(null)")


async def test_an_end_is_answered_only_by_the_pass_that_writes_it(tmp_path):
    """The hook forgets an event once answered: an end answered before it was written,
    the daemon killed in between, left its run open for ever, reserved and never
    charged (the chaos test, tests/integration/test_slurm_chaos.py, saw it). The
    answer comes from the pass, after its batch is written."""
    scheduler = await pool_world(tmp_path)
    scheduler.accounts.create("alice", False, 10.0, 0.0)
    start = PoolRunEvent(
        "start", "45", "job", "spot", "spot-0", user="alice", account="", cpus=2, limit_h=1.0
    )
    assert await take(scheduler, start) == "reserved"
    end = dataclasses.replace(lost_start_end("45", "alice"), started_at=1000.0, ended_at=1900.0)
    answer = scheduler.pool_run(end)
    assert answer is not None and not answer.done()  # queued, not yet written
    await scheduler.tick()
    assert answer.result() == "ended"
    assert rows(tmp_path, "SELECT state FROM slurm_runs") == [("succeeded",)]
    assert scheduler.accounts.view("alice")["charged_cpu_h"] == pytest.approx(0.5)


async def test_a_run_whose_end_never_came_is_settled_when_the_next_run_starts(tmp_path):
    """Slurm starts a job's next run (a requeue) only after its last one ended: that
    run is settled then, as preempted, charged until the new start (the most it can
    have run) and its reservation's rest released, not left reserved for ever."""
    clock = SimClock(1000.0)
    scheduler = await pool_world(tmp_path, clock)
    scheduler.accounts.create("alice", False, 10.0, 0.0)

    def start(restart: int) -> PoolRunEvent:
        return PoolRunEvent(
            "start", "46", "job", "spot", "spot-0", user="alice", account="",
            restart=restart, cpus=2, limit_h=1.0,
        )  # fmt: skip

    assert await take(scheduler, start(0)) == "reserved"
    clock.advance_to(1000.0 + 1800.0)  # its end (a node failure) is never told
    assert await take(scheduler, start(1)) == "reserved"
    await scheduler.store.flush()
    assert rows(
        tmp_path, "SELECT restart, state, started_at, ended_at, reason FROM slurm_runs "
        "ORDER BY restart"
    ) == [
        (0, "preempted", 1000.0, 2800.0,
         "its end was not reported: taken as preempted when its next run started"),
        (1, "running", 2800.0, None, ""),
    ]  # fmt: skip
    alice = scheduler.accounts.view("alice")
    assert alice["charged_cpu_h"] == pytest.approx(1.0)  # 2 CPUs for half an hour
    assert alice["reserved_cpu_h"] == pytest.approx(2.0)  # the new run's only
    assert rows(tmp_path, "SELECT kind FROM ledger WHERE account = 'alice' ORDER BY id") == [
        ("reserve",), ("charge",), ("release",), ("reserve",),
    ]  # fmt: skip


async def test_an_older_runs_end_that_comes_late_leaves_the_open_run_be(tmp_path):
    """A run's end that comes after the job's next run started (resent from the hook's
    spool) is told apart by Slurm's START, earlier than the open run's prolog: it was
    settled at that start, and the open run runs on until its own end."""
    clock = SimClock(1000.0)
    scheduler = await pool_world(tmp_path, clock)
    scheduler.accounts.create("alice", False, 10.0, 0.0)

    def start(restart: int, sent_at: float) -> PoolRunEvent:
        return PoolRunEvent(
            "start", "46", "job", "spot", "spot-0", user="alice", account="",
            restart=restart, cpus=2, limit_h=1.0, started_at=sent_at,
        )  # fmt: skip

    def end(state: str, began: float, ended: float) -> PoolRunEvent:
        return PoolRunEvent(
            "end", "46", "job", "spot", "spot-0", user="alice", account="", cpus=2,
            state=state, exit_code=0, started_at=began, ended_at=ended,
        )  # fmt: skip

    assert await take(scheduler, start(0, 1000.3)) == "reserved"
    clock.advance_to(2800.0)
    assert await take(scheduler, start(1, 2799.6)) == "reserved"  # run 0 settled
    clock.advance_to(2810.0)
    assert await take(scheduler, end("NODE_FAIL", 1000.0, 1900.0)) == "ended"  # run 0's
    clock.advance_to(4600.0)
    assert await take(scheduler, end("COMPLETED", 2799.0, 4599.0)) == "ended"  # run 1's
    await scheduler.store.flush()
    assert rows(
        tmp_path, "SELECT restart, state, started_at, ended_at FROM slurm_runs ORDER BY restart"
    ) == [(0, "preempted", 1000.0, 2800.0), (1, "succeeded", 2799.0, 4599.0)]
    alice = scheduler.accounts.view("alice")
    assert alice["charged_cpu_h"] == pytest.approx(2 * (1800 + 1800) / 3600)
    assert alice["reserved_cpu_h"] == pytest.approx(0.0)


async def test_the_hook_is_told_an_end_was_taken_only_once_it_is_written(tmp_path, monkeypatch):
    """The callback route's side (controller/slurm/events.py): a jobcomp of a pool run
    is answered after the pass that writes it, and with 503 (the hook spools it and
    sends it again) when no pass has written it in time; the copy sent again waits on
    the same end, not answered as a duplicate before it is written."""

    scheduler = await pool_world(tmp_path)
    scheduler.accounts.create("alice", False, 10.0, 0.0)
    # Only the pool path runs here: it asks nothing of the Slurm executor.
    taken = events.SlurmCallbacks(None, lambda: scheduler, RealClock())  # type: ignore[arg-type]

    def jobcomp(job_id: str) -> SlurmEvent:
        return SlurmEvent(
            event="jobcomp", job_id=job_id, job_name="job", partition="spot", nodes="spot-0",
            user="alice", state="COMPLETED", exit_code="0:0", start=1000.0, end=1900.0,
        )  # fmt: skip

    monkeypatch.setattr(events, "POOL_VERDICT_WAIT_S", 0.2)
    late = jobcomp("48")
    with pytest.raises(ApiError) as refused:  # no pass meanwhile
        await taken._pool_job(late, scheduler)
    assert refused.value.status == 503 and "send it again" in refused.value.message
    assert rows(tmp_path, "SELECT count(*) FROM slurm_runs") == [(0,)]
    # The hook's next copy (a repeat: the route saw its key) waits on the same end.
    with pytest.raises(ApiError) as again:
        await taken.repeat_written(late.key)
    assert again.value.status == 503

    answered = asyncio.ensure_future(taken._pool_job(jobcomp("49"), scheduler))
    repeat = asyncio.ensure_future(taken.repeat_written(late.key))
    await asyncio.sleep(0)
    assert not answered.done() and not repeat.done()
    await scheduler.tick()  # writes both ends, then answers
    assert await answered is True
    await repeat  # answered (a duplicate) now that it is written
    assert rows(tmp_path, "SELECT job_id FROM slurm_runs ORDER BY job_id") == [("48",), ("49",)]
    await taken.repeat_written(late.key)  # written: a repeat is answered at once


async def test_a_pool_vm_lost_in_a_restart_has_its_node_let_go_at_once(tmp_path):
    """The daemon killed while a pool VM boots: the restarted daemon does not find the VM
    and tells the executor its node's VM is gone (the Slurm executor downs and powers
    the node down, and Slurm requeues its users' jobs at once), as for a pool VM found
    gone while running. Telling nothing left the node powering up and its job waiting
    out ResumeTimeout (the chaos test, tests/integration/test_slurm_chaos.py)."""
    lost: list[tuple[str, str]] = []

    class Watched(SimExecutor):  # the sim executor, its vm_lost calls noted
        async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
            lost.append((vm_id, pool_node))
            await super().vm_lost(vm_id, pool_node)

    clock = SimClock(1000.0)
    scheduler = await pool_world(tmp_path, clock)
    assert scheduler.pool_power("resume", ["spot-0"]) == 1
    await scheduler.tick()  # the VM is launched for spot-0, and boots
    ((vm_id, pool_node),) = rows(tmp_path, "SELECT id, pool_node FROM vms")
    assert pool_node == "spot-0" and lost == []

    # A new daemon on the same database, whose driver has no such VM (it died with the
    # old one): its recovery lets the node go.
    cfg = config()
    executor = Watched(now=clock.now, call_at=clock.call_at, rng=np.random.default_rng(2))
    again = await world(tmp_path, clock, 2, cfg, store=scheduler.store, executor=executor)
    again.pools = scheduler.pools
    await again.recover()
    assert lost == [(vm_id, "spot-0")]
    assert rows(tmp_path, f"SELECT state, reason FROM vms WHERE id = '{vm_id}'") == [
        ("terminated", "not found after controller restart")
    ]
