"""`spotbag simulate --price-trace`: the spot market follows a trace series
(controller/traces/price_trace.py TraceMarket). A spot VM is billed the trace's price
over its life, Σ price × time, worked by hand here; a price above the bid (the
on-demand price) preempts spot VMs and refuses their launches until it falls back."""

from __future__ import annotations

import sqlite3

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.config import load_config
from controller.scheduler.planning import OUTBID_RECHECK_S
from controller.simulation import AUTO_TICK_MAX_S, SimulationSetupError, simulate
from controller.traces.price_trace import PriceTrace, TraceMarket

T0 = 1_400_000_000.0  # trace time the runs start at
START = 1_767_225_600.0  # the simulation's clock at its start (simulation.start_at)
H = 3600.0


def write_trace(path, changes: list[tuple[float, float]]) -> str:
    """One series, c3.xlarge/us-east-1a, on-demand 1.00 $/h: (trace hours from T0, price)."""
    lines = [
        "region,az,instance_type,product,timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr"
    ]
    for hours, price in changes:
        lines.append(f"us-east-1,us-east-1a,c3.xlarge,Linux/UNIX,{T0 + hours * H:.0f},{price},1.00")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def config_for(trace: str):
    return load_config(
        None,
        **{
            "scheduler.max_vms": 1,
            "scheduler.idle_timeout_s": 0.0,
            "preemption.model": "none",
            "simulation.boot_delay_s": 0.0,
            "simulation.price_trace": trace,
            "simulation.trace_series": "c3.xlarge/us-east-1a",
            "simulation.trace_start": f"{T0:.0f}",
            "vm_types": [
                {
                    "name": "c3",
                    "cpus": 1,
                    "memory_gb": 4,
                    # Never paid: the trace's price is.
                    "spot_price_per_hour": 0.5,
                    "on_demand_price_per_hour": 1.0,
                }
            ],
        },
    )


def bag(runtime_h: float) -> dict:
    return {
        "account": "test",
        "command": "run",
        "resources": {"cpus": 1, "memory_gb": 1},
        "max_runtime_s": 10 * H,
        "estimated_runtime_s": runtime_h * H,
        "max_attempts": 5,
    }


def vm_rows(state_dir) -> list[tuple]:
    with sqlite3.connect(state_dir / "spotbag.db") as db:
        return db.execute(
            "SELECT state, reason, requested_at, running_at, ended_at FROM vms ORDER BY requested_at"
        ).fetchall()


async def test_a_spot_vm_is_billed_the_traces_price_over_its_life(tmp_path):
    # 0.10 $/h for the first 2 h, 0.30 $/h after; one 3-hour job on one VM from t = 0.
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10), (2, 0.30)])
    result = await simulate(bag(3.0), config_for(trace), seed=1, state_dir=tmp_path)
    assert result.bag["counts"]["succeeded"] == 1
    [(state, _, requested, running, ended)] = vm_rows(tmp_path)
    assert state == "terminated" and requested == running == START
    life_h = (ended - running) / H
    # The job's 3 h, released within the next pass (a pass at most every 10 s for 3-h jobs).
    assert 3.0 <= life_h <= 3.0 + (AUTO_TICK_MAX_S + 2) / H
    # By hand: 2 h at 0.10 + the rest (1 h and the pass) at 0.30 = 0.50 $ and a little.
    by_hand = 2 * 0.10 + (life_h - 2) * 0.30
    assert by_hand == pytest.approx(0.50, abs=0.001)
    usage = result.bag["usage"]
    assert usage["spot_cost_usd"] == pytest.approx(by_hand, rel=1e-9)
    assert usage["on_demand_cost_usd"] == pytest.approx(life_h * 1.0, rel=1e-9)


async def test_a_price_above_the_bid_preempts_and_stops_launches_until_it_falls(tmp_path):
    # 0.10 $/h, above the bid (2.00 > 1.00) from 1 h to 3 h, 0.10 again after.
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10), (1, 2.00), (3, 0.10)])
    result = await simulate(bag(2.0), config_for(trace), seed=1, state_dir=tmp_path)
    assert result.bag["counts"]["succeeded"] == 1
    rows = vm_rows(tmp_path)
    ran = [r for r in rows if r[3] is not None]
    refused = [r for r in rows if r[3] is None]
    first, second = ran  # the first VM, outbid; the second once the price fell
    assert first[0] == "preempted" and "above the bid" in first[1]
    assert first[4] == pytest.approx(START + 1 * H)
    # No launch was tried while the price was above the bid (the scheduler reads the
    # price: each would be refused, a failed VM); the price is looked at again every
    # OUTBID_RECHECK_S at most, so the next VM comes within that of its fall.
    assert refused == []
    assert START + 3 * H <= second[3] <= START + 3 * H + OUTBID_RECHECK_S
    assert second[0] == "terminated"
    # The job ran from scratch on the second VM (it does not checkpoint): 2 h.
    assert second[4] - second[3] == pytest.approx(2 * H, abs=AUTO_TICK_MAX_S + 2)  # + a pass
    # Billed: 1 h at 0.10 on the first, the second's life at 0.10.
    by_hand = 0.10 * 1.0 + 0.10 * (second[4] - second[3]) / H
    assert result.bag["usage"]["spot_cost_usd"] == pytest.approx(by_hand, rel=1e-9)


async def test_a_budget_reserves_at_the_traces_price_not_the_catalogs(tmp_path):
    # An attempt reserves its worst case, max_runtime_s (10 h) at the spot price: $1.00
    # at the trace's 0.10 $/h, within a $1.50 budget; at the catalog's 0.50 $/h it would
    # be $5.00, and the bag would be held for good.
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10)])
    result = await simulate(
        {**bag(1.0), "budget_usd": 1.5}, config_for(trace), seed=1, state_dir=tmp_path
    )
    assert result.bag["counts"]["succeeded"] == 1
    assert result.bag["usage"]["spot_cost_usd"] == pytest.approx(0.10, rel=0.01)


def test_the_expected_outage_is_the_past_windows_mean_at_least_as_long_again():
    import numpy as np

    # Above the bid (1.0) over [1, 2) h and [5, 8) h and from 10 h on: mean 2 h.
    times = np.array([0, 1, 2, 5, 8, 10]) * H
    prices = np.array([0.1, 2.0, 0.1, 2.0, 0.1, 2.0])
    trace = PriceTrace((("t", "z"),), (times,), (prices,), np.array([1.0]))
    market = TraceMarket(trace, ("t", "z"), started_at_s=0.0, trace_start_s=0.0)
    assert market.outage_left_s("t", "z", 1.0, 9 * H) == 0.0
    assert market.outage_left_s("t", "z", 1.0, 10.5 * H) == pytest.approx(1.5 * H)  # 2 − 0.5
    assert market.outage_left_s("t", "z", 1.0, 13 * H) == pytest.approx(3 * H)  # so far: 3
    assert market.first_above("t", "z", 1.0, 2 * H) == 5 * H
    assert market.first_above("t", "z", 5.0, 0.0) == float("inf")
    assert market.price_at("t", "z", 4.99 * H) == 0.1


async def test_a_series_the_trace_lacks_is_refused(tmp_path):
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10)])
    config = config_for(trace)
    config = config.model_copy(
        update={"simulation": config.simulation.model_copy(update={"trace_series": "x/y"})}
    )
    with pytest.raises(SimulationSetupError, match="no series x/y"):
        await simulate(bag(1.0), config, seed=1, state_dir=tmp_path)


def test_the_cli_takes_the_trace_options(tmp_path):
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10), (2, 0.30)])
    spec = tmp_path / "bag.json"
    import json

    spec.write_text(json.dumps(bag(3.0)))
    conf = tmp_path / "spotbag.toml"
    conf.write_text(
        '[scheduler]\nmax_vms = 1\nidle_timeout_s = 0\n[preemption]\nmodel = "none"\n'
        "[simulation]\nboot_delay_s = 0\n"
        '[[vm_types]]\nname = "c3"\ncpus = 1\nmemory_gb = 4\nspot_price_per_hour = 0.5\n'
        "on_demand_price_per_hour = 1.0\n"
    )
    out = CliRunner().invoke(
        cli,
        [
            "simulate",
            str(spec),
            "--config",
            str(conf),
            "--price-trace",
            trace,
            "--trace-series",
            "c3.xlarge/us-east-1a",
            "--trace-start",
            f"{T0:.0f}",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    usage = json.loads(out.output)["bag"]["usage"]
    assert usage["spot_cost_usd"] == pytest.approx(0.50, abs=0.001)  # not 3 h × 0.5


def deadline_bag(policy: str, on_demand: str) -> dict:
    """20 one-hour jobs on 10 one-job VMs, due in 3 h."""
    return {
        **bag(1.0),
        "command": "run {i}",
        "parameters": {"i": {"range": [0, 20]}},
        "deadline": "3h",
        "on_demand": on_demand,
        "deadline_policy": policy,
    }


@pytest.mark.slow  # a whole bag through the scheduler, seconds each: in `make test`
@pytest.mark.parametrize("policy", ["uniform_progress", "spotbag"])
async def test_a_deadline_policy_escalates_while_spot_is_outbid_and_meets_it(tmp_path, policy):
    # Spot is above the bid for the first hour: on spot alone the bag's 2 h of rounds
    # start at 1 h and end after 3 h. Uniform Progress falls behind its line with no spot
    # to be had (rule 1) and goes on-demand; spotbag's policy sees the outage.
    trace = write_trace(tmp_path / "trace.csv", [(0, 2.00), (1, 0.10)])
    config = config_for(trace)
    config = config.model_copy(
        update={
            "scheduler": config.scheduler.model_copy(update={"max_vms": 10}),
            "simulation": config.simulation.model_copy(update={"boot_delay_s": 60.0}),
        }
    )
    spot_only = await simulate(
        deadline_bag(policy, "never"), config, seed=1, state_dir=tmp_path / "spot"
    )
    assert spot_only.bag["elapsed_s"] > 3 * H  # missed
    result = await simulate(
        deadline_bag(policy, "when_needed"), config, seed=1, state_dir=tmp_path / "escalated"
    )
    assert result.bag["counts"]["succeeded"] == 20
    assert result.bag["elapsed_s"] <= 3 * H
    with sqlite3.connect(tmp_path / "escalated" / "spotbag.db") as db:
        on_demand = [at for (at,) in db.execute("SELECT requested_at FROM vms WHERE spot = 0")]
    assert len(on_demand) >= 1
    if policy == "uniform_progress":
        # Rule 1 (behind the line, no spot), within a decision or two of the start, not
        # the safety net, which would fire only near 1 h (R < C(t) + 2d).
        assert min(on_demand) <= START + 60


async def test_each_job_can_take_its_own_runtime_from_a_parameter(tmp_path):
    # Jobs of 1, 2 and 3 h (their `runtime_s`) on one VM after another, spot at 0.10 $/h:
    # 6 h of attempts; a job whose value is not a runtime (0) takes the bag's runtime_s,
    # 0.5 h.
    trace = write_trace(tmp_path / "trace.csv", [(0, 0.10)])
    spec = {
        **bag(1.0),
        "command": "run {i}",
        "points": [
            {"i": 0, "runtime_s": 1 * H},
            {"i": 1, "runtime_s": 2 * H},
            {"i": 2, "runtime_s": 0},
            {"i": 3, "runtime_s": 3 * H},
        ],
        "simulation": {"runtime_param": "runtime_s", "runtime_s": 0.5 * H},
    }
    result = await simulate(spec, config_for(trace), seed=1, state_dir=tmp_path)
    assert result.bag["counts"]["succeeded"] == 4
    assert result.bag["usage"]["attempt_hours"] == pytest.approx(6.5)
