"""`spotbag index` and `spotbag simulate-hopping` on trace files written here (and, when
the shared data is present, on the real 2015 trace), through click's runner."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.cli.hopping import index_command, simulate_hopping_command
from controller.tools.hopping_report import parse_job
from controller.traces.price_trace import TraceReplay, read_trace
from controller.traces.reference_data import SPOT_PRICES
from controller.traces.trace_io import TraceError
from policies.hopping import Phase

REAL_TRACE = SPOT_PRICES
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


def test_the_index_plot_draws_in_each_panel_the_vms_its_index_is_taken_over(tmp_path, monkeypatch):
    """--by region: each region's panel shows that region's VMs only (the plot once kept
    its own membership rule, which knew zones and families but not regions)."""
    Axes = pytest.importorskip("matplotlib.axes").Axes
    rows = [HEADER]
    for region, zone in (("us-east-1", "us-east-1a"), ("us-west-2", "us-west-2b")):
        for vm_type in ("r3.large", "c3.xlarge"):
            for step in range(36):
                stamp = f"2015-03-01 {step // 6:02d}:{step % 6 * 10:02d}:00+00:00"
                price = 0.02 + 0.001 * (step % 5)
                rows.append(f"{region},{zone},{vm_type},Linux,{stamp},{price},0.2")
    trace = tmp_path / "regions.csv"
    trace.write_text("\n".join(rows) + "\n")
    drawn = []
    plot = Axes.plot

    def recording(self, *args, **kwargs):
        drawn.append((self, kwargs.get("label")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", recording)
    out = tmp_path / "regions.png"
    result = CliRunner().invoke(cli, ["index", str(trace), "--by", "region", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    panels: dict[str, set[str]] = {}
    for axes, label in drawn:
        panels.setdefault(axes.get_title(), set()).add(label)
    assert panels == {
        "region us-east-1": {"r3.large/us-east-1a", "c3.xlarge/us-east-1a", "index"},
        "region us-west-2": {"r3.large/us-west-2b", "c3.xlarge/us-west-2b", "index"},
    }


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


@pytest.mark.slow
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


# --- sizes of the trace's types ------------------------------------------------------


def write_types_trace(path, types, zone="us-east-1a", region="us-east-1", minutes=120, seed=1):
    """A price each minute for each (type, mean ¢/h, on-demand $/h) of `types`."""
    rng = np.random.default_rng(seed)
    rows = [HEADER]
    for vm_type, mean_cents, on_demand in types:
        for minute in range(minutes):
            price = mean_cents / 100 * rng.uniform(0.8, 1.2)
            stamp = f"2017-06-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
            rows.append(f"{region},{zone},{vm_type},Linux,{stamp},{price:.5f},{on_demand}")
    path.write_text("\n".join(rows) + "\n")
    return path


# The four VMs of the index-tracking paper's synthetic experiment (SoCC'18 §6.2).
PAPER_TYPES = [
    ("m4.large", 4.5, 0.10),
    ("m4.2xlarge", 8.5, 0.40),
    ("c4.2xlarge", 6.5, 0.398),
    ("r4.xlarge", 6.5, 0.266),
]


def test_the_papers_types_are_sized_end_to_end(tmp_path):
    trace = write_types_trace(tmp_path / "paper.csv", PAPER_TYPES)
    args = ["--job", "4:16:30m,2:8:30m", "--step", "1m", "--window", "10m", "--decide-every", "1m"]
    done = CliRunner().invoke(cli, ["simulate-hopping", str(trace), *args, "--json"])
    assert done.exit_code == 0, done.output
    rows = {row["policy"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"static", "cost", "availability", "balanced"}
    assert all(row["finished"] and 1.0 <= row["work_h"] < 1.05 for row in rows.values())
    index = CliRunner().invoke(cli, ["index", str(trace), "--by", "family", "--json"])
    assert index.exit_code == 0, index.output
    assert {row["composition"] for row in json.loads(index.stdout)} == {"m4", "c4", "r4"}


def test_gce_machine_types_are_sized(tmp_path):
    gce = [("n1-standard-4", 4.0, 0.19), ("e2-highmem-4", 5.0, 0.18), ("e2-medium", 1.0, 0.034)]
    trace = write_types_trace(tmp_path / "gce.csv", gce, zone="us-central1-a", region="us-central1")
    result = CliRunner().invoke(
        cli, ["simulate-hopping", str(trace), "--job", "2:12", "--step", "1m", "--window", "10m"]
    )
    assert result.exit_code == 0, result.output
    assert "balanced" in result.output


def test_a_types_file_or_a_config_sizes_what_the_table_lacks(tmp_path):
    trace = write_types_trace(
        tmp_path / "odd.csv", [("z9.huge", 50.0, 4.0), ("m4.large", 4.5, 0.1)]
    )
    base = ["simulate-hopping", str(trace), "--job", "2:8", "--step", "1m", "--window", "10m"]
    unknown = CliRunner().invoke(cli, base)
    assert unknown.exit_code == 1
    assert "no size known for z9.huge" in unknown.output
    assert "--types FILE" in unknown.output and "--config FILE" in unknown.output
    sizes = tmp_path / "sizes.csv"
    sizes.write_text("name,vcpus,memory_gb\nz9.huge,96,768\n")
    assert CliRunner().invoke(cli, [*base, "--types", str(sizes)]).exit_code == 0
    sizes_json = tmp_path / "sizes.json"
    sizes_json.write_text('[{"name": "z9.huge", "vcpus": 96, "memory_gb": 768}]')
    assert CliRunner().invoke(cli, [*base, "--types", str(sizes_json)]).exit_code == 0
    config = tmp_path / "spotbag.toml"
    config.write_text(
        '[[vm_types]]\nname = "huge-1a"\ninstance_type = "z9.huge"\ncpus = 96\n'
        "memory_gb = 768.0\nspot_price_per_hour = 0.5\n"
    )
    assert CliRunner().invoke(cli, [*base, "--config", str(config)]).exit_code == 0
    index = CliRunner().invoke(cli, ["index", str(trace), "--types", str(sizes), "--json"])
    assert index.exit_code == 0, index.output
    bad = tmp_path / "bad.csv"
    bad.write_text("name,vcpus,memory_gb\nz9.huge,96,none\n")
    refused = CliRunner().invoke(cli, [*base, "--types", str(bad)])
    assert refused.exit_code == 2
    assert (
        "--types" in refused.output
        and "bad.csv:2: memory_gb must be a number > 0" in refused.output
    )


def test_only_types_keeps_some_types_and_types_wants_a_file(tmp_path):
    trace = write_types_trace(tmp_path / "paper.csv", PAPER_TYPES)
    base = ["simulate-hopping", str(trace), "--job", "2:8", "--step", "1m", "--window", "10m"]
    only = CliRunner().invoke(
        cli, [*base, "--only-types", "m4.large", "--policy", "cost", "--json"]
    )
    assert only.exit_code == 0, only.output
    assert json.loads(only.stdout)[0]["migrations"] == 0  # one VM: nowhere to move
    listed = CliRunner().invoke(cli, [*base, "--types", "m4.large,r4.xlarge"])
    assert listed.exit_code == 2
    assert "--types takes a file of VM sizes" in listed.output and "--only-types" in listed.output
