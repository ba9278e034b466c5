"""Preemption models at work in the scheduler (reuse, hot spares, release) and learned
from the lifetimes a controller observes."""

from __future__ import annotations

import numpy as np
import pytest

from controller.bags.admission import admit
from controller.clock import SimClock
from controller.config import load_config
from controller.preemption.learning import Learner
from controller.preemption.model_book import ModelBook
from controller.simulation import simulate
from controller.store import Store, WriteBatch
from policies.preemption import Bathtub
from policies.registry import ModelEntry, ModelKey
from tests.controller.simworld import rows, run_until, world

ONE_SLOT = [
    {
        "name": "v",
        "cpus": 2,
        "memory_gb": 8,
        "spot_price_per_hour": 0.02,
        "on_demand_price_per_hour": 0.1,
    }
]


def bathtub_config(policy: str, **extra):
    return load_config(
        None,
        **{
            "scheduler.max_vms": 5,
            "scheduler.idle_timeout_s": 60.0,
            "preemption.model": "bathtub",
            "preemption.reuse_policy": policy,
            "vm_types": ONE_SLOT,
            **extra,
        },
    )


def six_hour_jobs(n: int) -> dict:
    return {
        "account": "a",
        "command": "run {i}",
        "parameters": {"i": {"range": [0, n]}},
        "resources": {"cpus": 2, "memory_gb": 4},
        "max_runtime_s": 8 * 3600,
        "estimated_runtime_s": 6 * 3600,
        "max_attempts": 50,
    }


async def test_the_model_policy_interrupts_far_fewer_jobs_than_always_reusing(tmp_path):
    interrupted = {}
    for policy in ("always", "model"):
        total = 0
        for seed in range(3):
            result = await simulate(
                six_hour_jobs(60),
                bathtub_config(policy),
                seed=seed,
                state_dir=tmp_path / f"{policy}{seed}",
            )
            assert result.bag["state"] == "succeeded"
            total += result.bag["usage"]["interrupted_attempts"]
        interrupted[policy] = total
    assert interrupted["model"] < 0.6 * interrupted["always"], interrupted


async def test_a_stable_idle_vm_is_kept_as_a_hot_spare(tmp_path):
    # A 3-hour job: by its end the VM is past its early phase (tau1 = 2.3 h).
    spec = {**six_hour_jobs(1), "estimated_runtime_s": 3 * 3600, "max_runtime_s": 4 * 3600}
    for model, reason in (("bathtub", "hot spare idle for 3600 s"), ("none", "idle for 60 s")):
        config = load_config(
            None,
            **{
                "scheduler.idle_timeout_s": 60.0,
                "preemption.model": model,
                "preemption.hot_spare_h": 1.0,
                "vm_types": ONE_SLOT,
                "preemption.bathtub_A": 0.01,
            },
        )  # rarely preempted: the VM lives on
        await simulate(spec, config, seed=1, state_dir=tmp_path / model)
        assert rows(tmp_path / model, "SELECT reason FROM vms") == [(reason,)]


async def test_an_old_vm_is_released_for_a_job_it_could_not_finish(tmp_path):
    # Few preemptions, but every VM is reclaimed at the 24 h deadline.
    config = bathtub_config("model", **{"scheduler.max_vms": 1, "preemption.bathtub_A": 0.01})
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 2, config)
    spec = {**six_hour_jobs(2), "estimated_runtime_s": 20 * 3600, "max_runtime_s": 22 * 3600}
    await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=config.catalog(),
        bag_id="b0000000001",
        now=0.0,
        max_jobs=10,
        offload=False,
    )
    await run_until(scheduler, clock, 4 * 86400)
    await scheduler.store.close()
    vms = rows(tmp_path, "SELECT reason FROM vms ORDER BY requested_at")
    assert vms[0][0].startswith(
        "released: a fresh VM is better for 20.0 h jobs than this one at 20.0 h"
    )
    # Neither job was cut short: the second one ran on a fresh VM.
    assert rows(tmp_path, "SELECT state, count(*) FROM attempts GROUP BY state") == [
        ("succeeded", 2)
    ]


def vm_rows(lifetimes_h, preempted, *, start_id: int, launched_after_s: float = 0.0) -> WriteBatch:
    """Ended VMs of type v in zone z-a, launched a minute apart from `launched_after_s` on."""
    batch = WriteBatch()
    for i, (life, dead) in enumerate(zip(lifetimes_h, preempted, strict=True)):
        requested = 1_767_225_600.0 + launched_after_s + 60.0 * (start_id + i)
        batch.vm(
            {
                "id": f"vm-{start_id + i:012x}",
                "provider_id": "",
                "driver": "sim",
                "vm_type": "v",
                "zone": "z-a",
                "spot": 1,
                "state": "preempted" if dead else "terminated",
                "reason": "",
                "cpus": 2,
                "gpus": 0,
                "memory_gb": 8.0,
                "spot_price_per_hour": 0.02,
                "on_demand_price_per_hour": 0.1,
                "requested_at": requested,
                "running_at": requested,
                "ended_at": requested + life * 3600.0,
                "time_scale": 1.0,
            }
        )
    return batch


async def test_models_are_learned_from_observed_lifetimes_and_refit_on_drift(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    await store.open()
    config = load_config(
        None,
        **{
            "preemption.model": "bathtub",
            "preemption.min_samples": 50,
            "preemption.drift_window": 50,
        },
    )
    book = ModelBook(config.preemption, "sim", {}, launch_h=0.02)
    learner = Learner(store, book, config.preemption, "sim", now=lambda: 1_800_000_000.0)
    learner.rng = np.random.default_rng(0)
    rng = np.random.default_rng(11)
    truth = Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0)
    lives = truth.sample_h(rng, 500)
    stops = rng.exponential(15.0, 500)
    await store.apply(vm_rows(np.minimum(lives, stops), lives <= stops, start_id=0))

    learned = await learner.refit_once()
    by_key = {e.key.text(): e for e in learned}
    entry = by_key["sim/v/z-a/*/*"]
    assert entry.n == 500 and entry.source == "learned"
    grid = np.linspace(0, 24, 97)
    assert np.max(np.abs(entry.model.cdf(grid) - truth.cdf(grid))) < 0.05
    assert book.belief(config.catalog()[0], "z-a").source == "learned"
    assert await learner.refit_once() == []  # nothing new: no refit

    # The provider changes its behaviour: 60 VMs launched a day later (under 20% more
    # data) all die within the hour.
    fast = rng.exponential(0.3, 60)
    await store.apply(vm_rows(fast, np.ones(60, bool), start_id=500, launched_after_s=86_400.0))
    refit = {e.key.text(): e for e in await learner.refit_once()}
    new_model = refit["sim/v/z-a/*/*"].model
    assert float(new_model.cdf(1.0)) > float(entry.model.cdf(1.0)) + 0.2  # it learned the change
    history = await store.models(active_only=False)
    reasons = [m["reason"] for m in history if m["key"] == "sim/v/z-a/*/*"]
    assert reasons[0].startswith("drift: KS") and "refitted on the latest 100" in reasons[0]
    assert reasons[1] == "first fit on 500 lifetimes"
    assert [m["active"] for m in history if m["key"] == "sim/v/z-a/*/*"] == [1, 0]
    assert await learner.refit_once() == []  # no new VMs since: no refit loop

    # After a restart the learned models are used again.
    fresh_book = ModelBook(config.preemption, "sim", {}, launch_h=0.02)
    assert await Learner(store, fresh_book, config.preemption, "sim", lambda: 0.0).load() == len(
        [m for m in history if m["active"]]
    )
    assert fresh_book.belief(config.catalog()[0], "z-a").model == new_model
    await store.close()


def test_a_learned_model_for_all_types_does_not_replace_a_type_specific_one():
    config = load_config(
        None,
        **{
            "preemption.model": "fitted",
            "vm_types": [{**ONE_SLOT[0], "model_key": "gce/n1-highcpu-16"}],
        },
    )
    book = ModelBook(config.preemption, "sim", {"v": "gce/n1-highcpu-16"}, launch_h=0.02)
    pooled = ModelEntry(ModelKey("sim"), Bathtub(A=0.9, tau1=0.1, tau2=0.8, b=24.0), 500, 0)
    book.learn([pooled])
    assert book.belief(config.catalog()[0], "z").source == "default"
    typed = ModelEntry(ModelKey("sim", "v"), Bathtub(A=0.9, tau1=0.1, tau2=0.8, b=24.0), 500, 0)
    book.learn([typed])
    assert book.belief(config.catalog()[0], "z").source == "learned"


def test_fitted_mode_samples_from_the_shipped_model_for_the_type_key():
    config = load_config(
        None,
        **{
            "preemption.model": "fitted",
            "vm_types": [{**ONE_SLOT[0], "model_key": "gce/n1-highcpu-16/us-central1-c"}],
        },
    )
    book = ModelBook(
        config.preemption, "local", {"v": "gce/n1-highcpu-16/us-central1-c"}, launch_h=0.02
    )
    belief = book.configured(config.catalog()[0])
    assert belief.source == "default" and belief.key.startswith("gce/n1-highcpu-16/")
    assert isinstance(belief.model, Bathtub)
    assert book.table(belief.model) is not None
    lives = belief.model.sample_h(np.random.default_rng(0), 20_000)
    assert np.mean(lives == 24.0) == pytest.approx(belief.model.deadline_mass(), abs=0.02)


def test_lifetimes_drawn_in_blocks_are_those_drawn_one_at_a_time():
    """The local and sim drivers' lifetimes (controller/wiring.py LifetimeDraws): each VM
    takes the next uniform draw through its model, whichever model comes, across blocks
    of draws, as `sample_h(rng, 1)` per VM gives them; a model without preemptions takes
    no draw."""
    from controller.wiring import LIFETIMES_DRAWN, LifetimeDraws
    from policies.preemption import Exponential, NoPreemption, Weibull

    models = [
        Exponential(mttf_h=24.0, L=24.0),
        Weibull(k=0.7, lam=10.0, L=24.0),
        NoPreemption(),
        Bathtub(A=0.4, tau1=1.0, tau2=0.8, b=23.5, L=24.0),
    ]
    sequence = [models[(i * 7 + i // 5) % len(models)] for i in range(3 * LIFETIMES_DRAWN + 5)]
    one_at_a_time = np.random.default_rng(11)
    expected = [float(m.sample_h(one_at_a_time, 1)[0]) for m in sequence]
    draws = LifetimeDraws(np.random.default_rng(11))
    assert [draws.lifetime_h(m) for m in sequence] == expected
    assert any(v == float("inf") for v in expected) and len(set(expected)) > LIFETIMES_DRAWN
