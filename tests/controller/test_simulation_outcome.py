"""A simulation's outcome for a seed is what it was before the simulator's performance
work (issue 24): the same passes, attempts, preemptions, checkpoints, makespan, VM-hours
and cost, in a lock-step run and in one with runtime jitter and checkpoints.

The figures were printed by the code of d7824d8 (before that work), with a pass at
most every simulated second (`simulation.tick_s` 1, the default then). A change of the
scheduler's behaviour that is meant changes them: print the new ones with `outcome()`
and say in the commit why they moved."""

from __future__ import annotations

import logging
import sqlite3
import tempfile

import pytest

from controller.bags.spec import BagSpec
from controller.config import load_config
from controller.simulation import auto_tick_s, simulate
from controller.store import Store
from controller.store.engine import DEFERRABLE_INDEXES

BEFORE = {
    "lock-step": {
        "ticks": 855,
        "succeeded": 2000,
        "elapsed_s": 96285.94657707214,
        "attempts": 2168,
        "interrupted_attempts": 168,
        "checkpoints": 0,
        "attempt_hours": 2079.066201114125,
        "lost_hours": 79.06620111412472,
        "vm_hours": 1042.7413468323152,
        "spot_cost_usd": 20.229182128546935,
        "vms": 131,
        "vms_preempted": 85,
    },
    "jitter+checkpoints": {
        "ticks": 6250,
        "succeeded": 2000,
        "elapsed_s": 98011.30042910576,
        "attempts": 2169,
        "interrupted_attempts": 169,
        "checkpoints": 2000,
        "attempt_hours": 2088.5957027555837,
        "lost_hours": 43.86434520774417,
        "vm_hours": 1055.7910303839724,
        "spot_cost_usd": 20.48234598944899,
        "vms": 131,
        "vms_preempted": 85,
    },
}

VARIANTS = {
    "lock-step": {"runtime_cv": 0.0, "checkpointable": False},
    "jitter+checkpoints": {"runtime_cv": 0.1, "checkpointable": True},
}


async def outcome(
    tmp_path, runtime_cv: float, checkpointable: bool, tick_s: float | None = 1.0
) -> dict:
    """2,000 one-hour jobs, two per VM, on at most 40 VMs that live 12 h on average."""
    config = load_config(
        None,
        **{
            "simulation.tick_s": tick_s,
            "scheduler.max_vms": 40,
            "scheduler.idle_timeout_s": 300.0,
            "preemption.model": "exponential",
            "preemption.mttf_h": 12.0,
            "preemption.max_lifetime_h": 24.0,
            "checkpoint.policy": "young-daly",
            "vm_types": [
                {
                    "name": "n2-standard-2",
                    "cpus": 2,
                    "memory_gb": 8,
                    "spot_price_per_hour": 0.0194,
                    "on_demand_price_per_hour": 0.0971,
                }
            ],
        },
    )
    bag = {
        "account": "bench",
        "command": "run {i}",
        "parameters": {"i": {"range": [0, 2000]}},
        "resources": {"cpus": 1, "memory_gb": 4},
        "max_runtime_s": 14400,
        "estimated_runtime_s": 3600,
        "max_attempts": 10,
        "simulation": {"runtime_cv": runtime_cv},
    }
    if checkpointable:
        bag |= {"checkpointable": True, "checkpoint_cost_s": 60}
    result = await simulate(bag, config, seed=7, state_dir=tmp_path)
    usage = result.bag["usage"]
    return {
        "ticks": result.ticks,
        "succeeded": result.bag["counts"]["succeeded"],
        "elapsed_s": result.bag["elapsed_s"],
        **{
            k: usage[k]
            for k in (
                "attempts",
                "interrupted_attempts",
                "checkpoints",
                "attempt_hours",
                "lost_hours",
                "vm_hours",
                "spot_cost_usd",
            )
        },
        "vms": result.fleet["total"]["vms"],
        "vms_preempted": result.fleet["total"]["vms_preempted"],
    }


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_the_outcome_for_a_seed_is_that_of_the_previous_code(tmp_path, variant):
    found = await outcome(tmp_path, **VARIANTS[variant])
    assert found == pytest.approx(BEFORE[variant], rel=1e-12)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_the_default_pass_interval_moves_the_outcome_little(tmp_path, variant):
    """`simulation.tick_s` unset (10 s for one-hour jobs: controller/simulation.py
    `auto_tick_s`): far fewer passes; each job that ends waits up to 10 s for the next,
    so its VM's hours and their cost may grow by at most 10 s an attempt."""
    before = BEFORE[variant]
    found = await outcome(tmp_path, **VARIANTS[variant], tick_s=None)
    assert found["ticks"] < before["ticks"]
    assert found["succeeded"] == before["succeeded"]
    assert abs(found["vms"] - before["vms"]) <= 2  # another preemption here or there
    most_h = found["attempts"] * 10 / 3600
    assert abs(found["vm_hours"] - before["vm_hours"]) <= most_h
    assert found["vm_hours"] == pytest.approx(before["vm_hours"], rel=0.01)
    assert found["spot_cost_usd"] == pytest.approx(before["spot_cost_usd"], rel=0.01)
    assert found["elapsed_s"] == pytest.approx(before["elapsed_s"], rel=0.01)


async def test_a_run_leaves_no_garbage_in_reference_cycles(tmp_path, caplog):
    """The simulator runs the scheduler without the cyclic garbage collector
    (controller/simulation.py `_no_cycle_collection`): what a run drops must be freed by
    reference counting, so the one collection after the run finds nothing."""
    caplog.set_level(logging.DEBUG, logger="spotbag.simulation")
    await outcome(tmp_path, **VARIANTS["jitter+checkpoints"])
    assert "simulation: 0 objects in reference cycles after the run" in caplog.messages


def indexes(path) -> set[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return set(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))


async def test_the_runs_database_has_every_index_after_the_run(tmp_path):
    """The run writes without the indexes it never reads and builds them at its end
    (controller/store/engine.py DEFERRABLE_INDEXES): the database it leaves has every
    index, as defined, that a new store has, and they hold every row."""
    fresh = Store(tmp_path / "fresh" / "spotbag.db")
    await fresh.open()
    await fresh.close()
    expected = indexes(tmp_path / "fresh" / "spotbag.db")
    assert {name for name, _ in expected} >= set(DEFERRABLE_INDEXES)
    await outcome(tmp_path / "run", **VARIANTS["lock-step"])
    run_db = tmp_path / "run" / "spotbag.db"
    assert indexes(run_db) == expected
    with sqlite3.connect(run_db) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        by_index = db.execute(
            "SELECT count(*) FROM jobs INDEXED BY jobs_by_state WHERE bag_id = ? AND state = ?",
            ("b0000000001", "succeeded"),
        ).fetchone()
        assert by_index == (2000,)


async def test_a_run_not_kept_leaves_nothing_behind_and_says_the_same(tmp_path, monkeypatch):
    """Without a state directory (`spotbag simulate` without --keep) the run's database
    lives in a temporary directory that goes with the run (it once stayed in /tmp: ~90 MB
    for the bench's bag, every run), and its summary is the kept run's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    config = load_config(
        None,
        **{"scheduler.max_vms": 4, "preemption.model": "exponential", "preemption.mttf_h": 2.0},
    )
    bag = {
        "account": "a",
        "command": "run {i}",
        "parameters": {"i": {"range": [0, 40]}},
        "resources": {"cpus": 1},
        "max_runtime_s": 7200,
        "estimated_runtime_s": 1800,
    }
    kept = await simulate(bag, config, seed=3, state_dir=tmp_path / "kept")
    gone = await simulate(bag, config, seed=3)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert gone.state_dir is None and kept.state_dir == tmp_path / "kept"
    assert gone.bag["usage"] == kept.bag["usage"] and gone.fleet == kept.fleet
    assert gone.bag["usage"]["interrupted_attempts"] > 0  # preemptions, retried


async def test_a_database_left_without_its_indexes_gets_them_at_the_next_open(tmp_path, caplog):
    """A simulation killed while it wrote without its indexes (SIGKILL: no `finally`)
    leaves them missing; the next open of the store builds them, as defined, and says so."""
    path = tmp_path / "spotbag.db"
    store = Store(path)
    await store.open()
    expected = indexes(path)
    await store.defer_indexes()
    await store.close()  # what a killed run leaves: the indexes dropped, never built
    assert {name for name, _ in indexes(path)} & set(DEFERRABLE_INDEXES) == set()
    caplog.set_level(logging.WARNING, logger="spotbag.store")
    again = Store(path)
    await again.open()
    await again.close()
    assert indexes(path) == expected
    assert any("built the indexes" in m for m in caplog.messages)


def bag_spec(**fields) -> BagSpec:
    return BagSpec.model_validate(
        {"account": "a", "command": "true", "resources": {"cpus": 1}, "max_runtime_s": 7200}
        | fields
    )


@pytest.mark.parametrize(
    ("fields", "notice_lead_s", "tick_s"),
    [
        ({"estimated_runtime_s": 3600}, 0.0, 10.0),  # 1/360 of an hour
        ({"estimated_runtime_s": 1800}, 0.0, 5.0),
        ({"estimated_runtime_s": 100}, 0.0, 1.0),  # never below 1 s
        ({"estimated_runtime_s": 36_000}, 0.0, 10.0),  # nor above 10 s
        ({}, 0.0, 10.0),  # max_runtime_s without an estimate
        ({"estimated_runtime_s": 3600, "simulation": {"runtime_s": 720}}, 0.0, 2.0),
        ({"estimated_runtime_s": 3600, "simulation": {"runtime_param": "t"}}, 0.0, 1.0),
        ({"estimated_runtime_s": 3600, "checkpointable": True}, 0.0, 10.0),
        ({"estimated_runtime_s": 3600, "checkpointable": True}, 30.0, 1.0),  # notices
        ({"estimated_runtime_s": 3600}, 30.0, 10.0),  # notices, nothing to checkpoint
        ({"estimated_runtime_s": 3600, "checkpointable": True, "deadline": "4h"}, 0.0, 1.0),
    ],
)
def test_the_default_pass_interval_follows_the_bag(fields, notice_lead_s, tick_s):
    if "simulation" in fields and "runtime_param" in fields["simulation"]:
        fields = fields | {"parameters": {"t": {"values": [60, 600]}}}
    assert auto_tick_s(bag_spec(**fields), notice_lead_s) == tick_s
