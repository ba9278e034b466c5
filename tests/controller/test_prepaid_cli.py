"""`spotbag prepaid`: reading SWF and CSV histories, the report it prints, and the
errors it gives. Files are real files in tmp_path; the command runs through click's
runner and, once, as a real process."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from controller.cli.prepaid import prepaid_command
from controller.tools.prepaid_report import analyse, read_csv, read_swf
from controller.traces.reference_data import SWF
from controller.traces.trace_io import TraceError, parse_time
from policies.prepaid import optimal_prepaid_cores, usage_levels
from tests.conftest import REPO

REAL_SWF = SWF

SWF_HEADER = """\
; Version: 2.2
; UnixStartTime: 1583160579
; MaxProcs: 64
; Partition: 0 gpu
; Partition: 1 batch
;
"""


def swf_line(job, submit, wait, run, procs, partition=1):
    fields = [job, submit, wait, run, procs, -1, -1, procs, 3600, -1, 1, 7, 7, -1, -1, partition]
    return "\t".join(str(f) for f in [*fields, -1, -1]) + "\n"


def write_swf(tmp_path: Path, body: str, name: str = "trace.swf") -> Path:
    path = tmp_path / name
    path.write_text(SWF_HEADER + body)
    return path


def run(*args: str):
    return CliRunner().invoke(prepaid_command, list(args))


# The hand example of tests/policies/test_prepaid.py in seconds: 2 cores on [0, 4 h),
# 1 core on [2 h, 6 h). The span is [0, 6 h): 2 h at each of 1, 2 and 3 cores;
# 12 core-hours; T(≥1) = 6 h, T(≥2) = 4 h, T(≥3) = 2 h.
HAND_CSV = "start,end,cores\n0,14400,2\n7200,21600,1\n"


def hand_csv(tmp_path: Path) -> Path:
    path = tmp_path / "usage.csv"
    path.write_text(HAND_CSV)
    return path


# --- readers --------------------------------------------------------------------------


def test_swf_jobs_run_from_submit_plus_wait_on_their_allocated_processors(tmp_path):
    body = (
        swf_line(1, 0, 10, 100, 4, 0)
        + swf_line(2, 50, 0, 30, 2)
        + swf_line(3, 60, 5, -1, 8)  # unknown run time: skipped
        + swf_line(4, 70, 5, 10, -1)  # unknown processors: skipped
        + swf_line(5, 80, 0, 0, 16)  # zero length: kept, counts for nothing
    )
    trace = read_swf(write_swf(tmp_path, body))
    base = 1583160579
    assert trace.starts.tolist() == [base + 10, base + 50, base + 80]
    assert trace.ends.tolist() == [base + 110, base + 80, base + 80]
    assert trace.cores.tolist() == [4, 2, 16]
    assert trace.skipped == 2
    assert trace.skipped_by_reason == {
        "unknown (-1) run time": 1,
        "unknown (-1) allocated and requested processors": 1,
    }
    assert "1 job(s) skipped: unknown (-1) run time" in trace.notes
    assert trace.core_types is None and trace.absolute
    by_partition = read_swf(write_swf(tmp_path, body), "partition")
    partitions = ["partition gpu", "partition batch", "partition batch"]
    assert by_partition.core_types.tolist() == partitions


def test_a_malformed_swf_line_is_named(tmp_path):
    short = write_swf(tmp_path, swf_line(1, 0, 1, 2, 3) + "2 0 1 2\n")
    with pytest.raises(TraceError, match=r"trace\.swf:8: expected 18 fields, found 4"):
        read_swf(short)
    words = write_swf(tmp_path, swf_line(1, 0, 1, 2, 3).replace("\t3\t", "\tmany\t", 1))
    with pytest.raises(TraceError, match=r"trace.swf:7: field 5 \(allocated_procs\) 'many'"):
        read_swf(words)
    with pytest.raises(TraceError, match="no core type 'gpu'"):
        read_swf(write_swf(tmp_path, swf_line(1, 0, 1, 2, 3)), "gpu")


def test_an_unknown_wait_means_the_job_started_when_submitted(tmp_path):
    # Several Parallel Workloads Archive logs record every wait as -1 (unknown).
    body = swf_line(1, 0, -1, 3600, 4) + swf_line(2, 1800, -1, 3600, 2)
    trace = read_swf(write_swf(tmp_path, body))
    base = 1583160579
    assert trace.starts.tolist() == [base, base + 1800]
    assert trace.ends.tolist() == [base + 3600, base + 5400]
    assert trace.skipped == 0
    assert trace.notes == ["2 job(s) with unknown (-1) wait: taken to start at their submit time"]
    result = run(
        "--swf", str(write_swf(tmp_path, body)), "--on-demand-price", "1",
        "--prepaid-price", "0.5", "--term", "1y", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["source"]["intervals"] == 2
    assert report["core_types"][0]["all_core_hours"] == pytest.approx(6.0)
    assert "unknown (-1) wait" in result.stderr


def test_unknown_allocated_processors_are_the_requested_ones(tmp_path):
    line = swf_line(1, 0, 0, 3600, -1).split("\t")
    line[7] = "8"  # field 8: requested processors
    trace = read_swf(write_swf(tmp_path, "\t".join(line)))
    assert trace.cores.tolist() == [8] and trace.skipped == 0
    assert "requested processors (field 8) used" in trace.notes[0]


def test_a_gzipped_swf_is_read_whatever_its_name(tmp_path):
    body = swf_line(1, 0, 10, 100, 4) + swf_line(2, 50, -1, 30, 2)
    packed = gzip.compress((SWF_HEADER + body).encode())
    for name in ("trace.swf.gz", "trace.swf"):  # by its bytes, not only its name
        (tmp_path / name).write_bytes(packed)
        trace = read_swf(tmp_path / name, "partition")
        assert trace.cores.tolist() == [4, 2]
        assert trace.core_types.tolist() == ["partition batch", "partition batch"]
    result = run(
        "--swf", str(tmp_path / "trace.swf.gz"), "--on-demand-price", "1",
        "--prepaid-price", "0.5", "--term", "1y", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"]["intervals"] == 2


def test_swf_fields_are_separated_by_any_whitespace(tmp_path):
    spaced = swf_line(1, 0, 10, 100, 4).replace("\t", "   ").replace("\n", "\r\n")
    mixed = " " + swf_line(2, 5, 0, 20, 2).replace("\t", " \t ", 3)
    trace = read_swf(write_swf(tmp_path, spaced + ";  a comment between jobs\n" + mixed))
    assert trace.cores.tolist() == [4, 2] and trace.starts.size == 2


def test_an_swf_with_no_usable_job_is_refused_with_the_reasons(tmp_path):
    body = swf_line(1, 0, 0, -1, 4) + swf_line(2, 0, 0, 10, 0) + swf_line(3, 0, 0, -1, 2)
    with pytest.raises(TraceError, match="none of its 3 jobs is usable"):
        read_swf(write_swf(tmp_path, body))
    result = run(
        "--swf", str(write_swf(tmp_path, body)), "--on-demand-price", "1",
        "--prepaid-price", "0.5", "--term", "1y",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--swf" in result.output
    assert "2 unknown (-1) run time; 1 no processors (0 allocated)" in result.output
    header_only = write_swf(tmp_path, "", "header.swf")
    with pytest.raises(TraceError, match=r"header\.swf: no jobs in the file"):
        read_swf(header_only)


def test_skipped_jobs_are_reported_per_reason_in_the_table_and_json(tmp_path):
    body = swf_line(1, 0, 0, 3600, 4) + swf_line(2, -1, 0, 10, 1) + swf_line(3, 0, 0, -1, 2)
    path = write_swf(tmp_path, body)
    prices = ["--on-demand-price", "1", "--prepaid-price", "0.5", "--term", "1y"]
    table = run("--swf", str(path), *prices)
    assert table.exit_code == 0, table.output
    assert "1 job(s) skipped: unknown (-1) submit time" in table.output
    assert "1 job(s) skipped: unknown (-1) run time" in table.output
    as_json = run("--swf", str(path), *prices, "--json")
    source = json.loads(as_json.stdout)["source"]
    assert source["skipped"] == 2 and source["intervals"] == 1
    assert source["skipped_by_reason"] == {
        "unknown (-1) submit time": 1,
        "unknown (-1) run time": 1,
    }
    assert "1 job(s) skipped: unknown (-1) submit time" in as_json.stderr


def test_a_gzipped_csv_history_is_read(tmp_path):
    path = tmp_path / "usage.csv.gz"
    path.write_bytes(gzip.compress(HAND_CSV.encode()))
    usage = read_csv(path)
    assert usage.cores.tolist() == [2, 1]


def test_csv_times_are_epoch_seconds_or_iso_8601(tmp_path):
    assert parse_time("1583160579") == 1583160579.0
    assert parse_time("1583160579.5") == 1583160579.5
    assert parse_time("2020-03-02T14:49:39Z") == 1583160579.0
    assert parse_time("2020-03-02T14:49:39") == 1583160579.0  # no zone: UTC
    assert parse_time("2020-03-02T16:49:39+02:00") == 1583160579.0
    with pytest.raises(ValueError, match="epoch seconds or ISO 8601"):
        parse_time("yesterday")
    path = tmp_path / "mixed.csv"
    path.write_text(
        "vm_type,cores,start,end\n"
        "c5,4,2020-03-02T00:00:00Z,2020-03-02T01:00:00Z\n"
        "m5,2,1583107200,1583110800\n"
        "\n"
    )
    usage = read_csv(path, "vm_type")
    assert usage.starts.tolist() == [1583107200.0, 1583107200.0]
    assert usage.ends.tolist() == [1583110800.0, 1583110800.0]
    assert usage.cores.tolist() == [4, 2] and usage.core_types.tolist() == ["c5", "m5"]
    assert read_csv(path).core_types is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "bad.csv:1: the file is empty"),
        ("begin,end,cores\n", "bad.csv:1: the header lacks column\\(s\\) start"),
        ("start,end,cores\n0,10,1\nnoon,20,1\n", "bad.csv:3: cannot read 'noon'"),
        ("start,end,cores\n0,10,1\n20,10,1\n", "bad.csv:3: end '10' is before start"),
        ("start,end,cores\n0,10,1.5\n", "bad.csv:2: cores must be a whole number"),
        ("start,end,cores\n0,10,-2\n", "bad.csv:2: cores must be a whole number"),
        ("start,end,cores\n0,10\n", "bad.csv:2: 2 fields, but the header has 3"),
        ("start,end,cores\n\n", "bad.csv: no intervals in the file"),
    ],
)
def test_bad_csv_lines_are_named(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_csv(path)


# --- the report ---------------------------------------------------------------------------


def test_the_json_report_on_the_hand_example(tmp_path):
    # Break-even 0.6: 0.6 × 6 h = 3.6 h; T(≥2) = 4 h reaches it, T(≥3) = 2 h does not.
    result = run(
        "--csv", str(hand_csv(tmp_path)), "--on-demand-price", "1", "--prepaid-price", "0.6",
        "--term", "1y", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["period"]["hours"] == 6.0
    assert report["period"]["start"] == "1970-01-01 00:00:00 UTC"
    assert report["break_even_utilisation"] == pytest.approx(0.6)
    (group,) = report["core_types"]
    assert group["core_type"] == "all"
    assert group["optimal_prepaid_cores"] == 2
    assert group["all_core_hours"] == pytest.approx(12.0)
    assert group["residual_on_demand_core_hours"] == pytest.approx(2.0)  # (3 - 2) · 2 h
    assert group["prepaid_cost_usd"] == pytest.approx(0.6 * 2 * 6)
    assert group["savings_usd"] == pytest.approx((12 - 2) - 0.6 * 2 * 6)  # 2.8
    assert group["savings_fraction"] == pytest.approx(2.8 / 12)
    assert group["last_prepaid_core_utilisation"] == pytest.approx(4 / 6)
    curve = {p["prepaid_cores"]: p["savings_usd"] for p in group["curve"]}
    assert curve == pytest.approx({0: 0.0, 1: 6 - 3.6, 2: 2.8, 3: 12 - 10.8})
    assert group["note"] is None


def test_an_upfront_price_is_spread_over_the_terms_hours(tmp_path):
    # 0.6 per core-hour = 5256 upfront for 1 year = 15768 for 3 years.
    for term, upfront in (("1y", "5256"), ("3y", "15768")):
        result = run(
            "--csv", str(hand_csv(tmp_path)), "--on-demand-price", "1",
            "--prepaid-upfront", upfront, "--term", term, "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["prices"]["prepaid_per_core_hour"] == pytest.approx(0.6)
        assert report["prices"]["prepaid_upfront_per_core"] == float(upfront)
        assert report["core_types"][0]["savings_usd"] == pytest.approx(2.8)


def test_the_table_per_core_type_and_its_curve(tmp_path):
    body = swf_line(1, 0, 0, 3600, 4, 0) + swf_line(2, 0, 0, 7200, 8) + swf_line(3, 0, 0, 60, 2)
    result = run(
        "--swf", str(write_swf(tmp_path, body)), "--on-demand-price", "0.0475",
        "--prepaid-price", "0.03", "--term", "3y", "--core-type", "partition",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "break-even utilisation 63.2 %" in out
    assert "2020-03-02 14:49:39 UTC" in out and "2.0 h, the span of the history" in out
    # batch: 8 cores for all 2 h (and 2 more for a minute): prepay 8. gpu: 4 cores for
    # half the span, below the break-even: prepay none, and say why.
    assert "savings curve, partition batch (* the optimum):" in out
    assert "8 *" in out
    assert "partition gpu: no core is busy 63.2 % of the period" in out
    lines = [line.split() for line in out.splitlines()]
    batch = next(words for words in lines if words[:2] == ["partition", "batch"])
    assert batch[2:5] == ["10", "16.0", "$0.762"]  # peak, core-hours, all on demand
    assert batch[5] == "8"


def test_prepaid_at_or_above_on_demand_explains_the_zero(tmp_path):
    result = run(
        "--csv", str(hand_csv(tmp_path)), "--on-demand-price", "0.03",
        "--prepaid-price", "0.03", "--term", "1y",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "prepaid $0.03 >= on-demand $0.03" in result.output
    assert "buy none" in result.output


def test_an_empty_history_is_refused(tmp_path):
    # A history without intervals would report 0 cores and $0 as if that were an answer.
    path = tmp_path / "empty.csv"
    path.write_text("start,end,cores\n")
    result = run(
        "--csv", str(path), "--on-demand-price", "1", "--prepaid-price", "0.5", "--term", "1y",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--csv" in result.output and "empty.csv: no intervals in the file" in result.output


def test_a_history_of_zero_length_intervals_prepays_nothing(tmp_path):
    path = tmp_path / "idle.csv"
    path.write_text("start,end,cores\n100,100,4\n")
    result = run(
        "--csv", str(path), "--on-demand-price", "1", "--prepaid-price", "0.5", "--term", "1y",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 intervals" in result.output
    assert "all: no core-hours in the period: nothing to prepay" in result.output


@pytest.mark.slow
def test_the_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "prepaid.png"
    result = run(
        "--csv", str(hand_csv(tmp_path)), "--on-demand-price", "1", "--prepaid-price", "0.5",
        "--term", "1y", "--plot", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    nowhere = tmp_path / "no" / "such" / "dir.png"
    result = run(
        "--csv", str(hand_csv(tmp_path)), "--on-demand-price", "1", "--prepaid-price", "0.5",
        "--term", "1y", "--plot", str(nowhere),
    )  # fmt: skip
    assert result.exit_code == 2 and "--plot" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prepaid-price", "0.03"], "exactly one of --swf, --csv or --from-store"),
        (["--swf", "{csv}", "--csv", "{csv}", "--prepaid-price", "0.03"], "got --swf, --csv"),
        (["--csv", "{csv}"], "exactly one of --prepaid-price or --prepaid-upfront"),
        (["--csv", "{csv}", "--prepaid-price", "1", "--prepaid-upfront", "1"], "exactly one"),
        (["--csv", "{csv}", "--prepaid-price", "-0.01"], "'--prepaid-price': -0.01"),
        (["--csv", "{missing}", "--prepaid-price", "0.03"], "'--csv': File"),
        (["--swf", "{bad_swf}", "--prepaid-price", "0.03"], "--swf: .*bad.swf:7: expected 18"),
        (
            ["--csv", "{csv}", "--prepaid-price", "0.03", "--core-type", "zone"],
            "--core-type: .*'zone'",
        ),
    ],
)
def test_refused_input_exits_2_and_names_the_option(tmp_path, args, message):
    csv_path = hand_csv(tmp_path)
    bad_swf = write_swf(tmp_path, "1 2 3\n", "bad.swf")
    files = {"csv": csv_path, "missing": tmp_path / "nope.csv", "bad_swf": bad_swf}
    argv = [a.format(**files) for a in args]
    result = run(*argv, "--on-demand-price", "0.05", "--term", "1y")
    assert result.exit_code == 2, result.output
    assert re.search(message, result.output), result.output


@pytest.mark.parametrize(("price", "shown"), [("0", "0: must be a positive"), ("nan", "nan")])
def test_the_on_demand_price_must_be_a_positive_number(tmp_path, price, shown):
    result = run(
        "--csv", str(hand_csv(tmp_path)), "--on-demand-price", price,
        "--prepaid-price", "0.01", "--term", "1y",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "'--on-demand-price'" in result.output and shown in result.output


@pytest.mark.processes
def test_the_command_as_a_real_process(tmp_path):
    command = "from controller.cli.prepaid import prepaid_command; prepaid_command()"
    args = ["--on-demand-price", "1", "--prepaid-price", "0.6", "--term", "1y"]
    done = subprocess.run(
        [sys.executable, "-c", command, "--csv", str(hand_csv(tmp_path)), *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["core_types"][0]["optimal_prepaid_cores"] == 2
    refused = subprocess.run(
        [sys.executable, "-c", command, "--csv", str(tmp_path / "absent.csv"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "--csv" in refused.stderr and "does not exist" in refused.stderr


# --- the real trace ------------------------------------------------------------------------


def test_the_real_swf_trace():
    trace = read_swf(REAL_SWF, "partition")
    assert trace.starts.size == 19_760 and trace.skipped == 0
    report = analyse(trace, 0.0475, prepaid_price=0.03, term="1y")
    assert set(report.results) == {
        "partition gpu",
        "partition serial",
        "partition debug",
        "partition batch",
    }
    assert 4000 < report.period_h < 5000  # March to September 2020
    whole = analyse(read_swf(REAL_SWF), 0.0475, prepaid_price=0.03, term="1y").results["all"]
    assert whole.all_core_hours == pytest.approx(
        sum(r.all_core_hours for r in report.results.values())
    )
    # The optimum is the best point of the whole curve, and the rule holds around it.
    assert 0 < whole.optimal_cores < whole.max_cores and whole.savings > 0
    assert whole.savings == pytest.approx(whole.curve_savings.max())
    usage = usage_levels(trace.starts, trace.ends, trace.cores, hours_per_unit=1 / 3600)
    again = optimal_prepaid_cores(usage, 0.0475, 0.03)
    assert again.optimal_cores == whole.optimal_cores
    k = whole.optimal_cores
    busy = usage.time_at_least_h(np.array([k, k + 1])) / usage.period_h
    assert busy[0] >= 0.03 / 0.0475 > busy[1]


def test_from_store_sizes_prepaid_capacity_from_the_vms_a_daemon_ran(tmp_path, monkeypatch):
    import asyncio
    import sqlite3

    from controller.simulation import simulate
    from tests.controller.simworld import bag, config

    prices = ["--on-demand-price", "0.04", "--prepaid-price", "0.02", "--term", "1y"]
    monkeypatch.setenv("SPOTBAG_STATE_DIR", str(tmp_path / "empty"))
    result = run("--from-store", *prices)
    assert result.exit_code == 2 and "no store at" in result.output

    state = tmp_path / "state"
    asyncio.run(simulate(bag(30, runtime_s=5400.0), config(), seed=2, state_dir=state))
    monkeypatch.setenv("SPOTBAG_STATE_DIR", str(state))
    result = run("--from-store", *prices, "--core-type", "vm_type", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    with sqlite3.connect(state / "spotbag.db") as conn:
        vms = conn.execute(
            "SELECT running_at, ended_at, cpus, vm_type FROM vms WHERE ended_at > running_at"
        ).fetchall()
    assert data["source"]["intervals"] == len(vms) > 0
    for group in data["core_types"]:
        mine = np.array([v[:3] for v in vms if v[3] == group["core_type"]], dtype=float)
        usage = usage_levels(mine[:, 0], mine[:, 1], mine[:, 2], hours_per_unit=1 / 3600)
        assert group["all_core_hours"] == pytest.approx(
            (mine[:, 2] * (mine[:, 1] - mine[:, 0])).sum() / 3600
        )
        # The span is the whole store's; per type the same rule applies over it.
        assert group["peak_cores"] == usage.max_cores
