"""`spotbag index` and `spotbag simulate-hopping` on trace files written here (and, when
the shared data is present, on the real 2015 trace), through click's runner."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from controller.hopping_report import index_command, parse_job, simulate_hopping_command
from controller.price_trace import TraceError, TraceReplay, read_trace
from policies.hopping import Phase
from tests.conftest import REPO

REAL_TRACE = REPO.parent / "shared/data/spot-prices/us-east-1_spot_2015-03_to_2015-08.csv.gz"
HEADER = "region,az,instance_type,product,timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr"


def write_trace(path, seed=0, hours=48):
    """r3.large and c3.xlarge in two zones: a change every 10 minutes; r3.large in zone a
    spikes above on-demand for an hour in the middle."""
    rng = np.random.default_rng(seed)
    rows = [HEADER]
    for zone in ("us-east-1a", "us-east-1b"):
        for vm_type, base, on_demand in (("r3.large", 0.02, 0.175), ("c3.xlarge", 0.04, 0.21)):
            for step in range(hours * 6):
                price = base * rng.uniform(0.7, 1.3)
                if vm_type == "r3.large" and zone == "us-east-1a" and 140 <= step < 146:
                    price = 0.5
                stamp = f"2015-03-{1 + step // 144:02d} {step % 144 // 6:02d}:{step % 6 * 10:02d}:00+00:00"
                rows.append(f"us-east-1,{zone},{vm_type},Linux,{stamp},{price:.4f},{on_demand}")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    return path


def test_index_by_zone_is_calmer_than_its_members(tmp_path):
    trace = write_trace(tmp_path / "t.csv.gz")
    plot = tmp_path / "i.png"
    result = CliRunner().invoke(
        index_command, [str(trace), "--by", "zone", "--json", "--plot", str(plot)]
    )
    assert result.exit_code == 0, result.output
    rows = {row["composition"]: row for row in json.loads(result.output)}
    assert set(rows) == {"us-east-1a", "us-east-1b"}
    assert all(row["index_cv"] < row["members_cv_mean"] for row in rows.values())
    assert plot.stat().st_size > 10_000


def test_simulate_hopping_counts_the_revocation_and_every_policy_beats_on_demand(tmp_path):
    trace = write_trace(tmp_path / "t.csv.gz")
    result = CliRunner().invoke(
        simulate_hopping_command,
        [
            str(trace),
            "--job",
            "2:10",
            "--step",
            "10m",
            "--window",
            "6h",
            "--zones",
            "us-east-1a",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {row["policy"]: row for row in json.loads(result.output)}
    assert set(rows) == {"static", "cost", "availability", "balanced"}
    # Only r3.large fits 10 GB in zone a: every policy sits on it, is revoked once, waits
    # out the hour-long spike (no usable VM) and restarts on it.
    for row in rows.values():
        assert row["revocations"] == 1 and row["migrations"] == 0
        assert row["waiting_h"] == pytest.approx(1.0, abs=0.2)
        assert row["normalized_cost"] < 0.2  # spot r3.large ~0.02 vs 0.175 on demand
        down_h = 1.0 + 90 / 3600
        assert row["availability"] == pytest.approx(1 - down_h / row["wall_h"], abs=0.005)


def test_bad_input_says_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "\nus-east-1,us-east-1a,r3.large,Linux,yesterday,0.1,0.2\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: timestamp_utc 'yesterday'"):
        read_trace(bad)
    result = CliRunner().invoke(simulate_hopping_command, [str(bad), "--job", "2"])
    assert result.exit_code != 0 and "--job: cannot read '2'" in result.output
    unknown = tmp_path / "unknown.csv"
    unknown.write_text(
        HEADER + "\nus-east-1,us-east-1a,z9.huge,Linux,2015-03-01 00:00:00+00:00,0.1,0.2\n"
    )
    result = CliRunner().invoke(simulate_hopping_command, [str(unknown), "--job", "2:10"])
    assert result.exit_code != 0 and "no size known for z9.huge" in result.output


def test_jobs_parse_into_phases():
    assert parse_job("2:10") == [Phase(math.inf, 2, 10)]
    assert parse_job("4:16:30m,2:8:30m") == [Phase(0.5, 4, 16), Phase(0.5, 2, 8)]
    with pytest.raises(ValueError, match="needs a duration"):
        parse_job("4:16,2:8")


def test_a_replayed_trace_gives_the_price_in_effect_at_the_drivers_time(tmp_path):
    trace = read_trace(write_trace(tmp_path / "t.csv.gz", hours=2))
    replay = TraceReplay(trace, started_at_s=1000.0, type_map={"small": "r3.large"}, speed=60.0)
    first = replay.prices_at(1000.0, ["small"], ["us-east-1a"])
    ten_minutes_on = replay.prices_at(1010.0, ["small"], ["us-east-1a"])  # 600 trace s
    assert [s.vm_type for s in first] == ["small"] and first[0].at == 1000.0
    r3a = trace.prices[trace.vms.index(("r3.large", "us-east-1a"))]
    assert first[0].price_per_hour == r3a[0] and ten_minutes_on[0].price_per_hour == r3a[1]


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="no ../shared/data")
def test_the_real_trace_cost_centric_moves_far_more_than_balanced():
    result = CliRunner().invoke(
        simulate_hopping_command,
        [str(REAL_TRACE), "--job", "2:10", "--policy", "cost", "--policy", "balanced", "--json"],
    )
    assert result.exit_code == 0, result.output
    rows = {row["policy"]: row for row in json.loads(result.output)}
    cost, balanced = rows["cost"], rows["balanced"]
    assert cost["migrations"] > 5 * balanced["migrations"]
    assert balanced["availability"] > cost["availability"]
    assert cost["normalized_cost"] < balanced["normalized_cost"] < 1.3 * cost["normalized_cost"]
