"""`spotbag split-cost FILE.json`: the example file's numbers, table and JSON output,
and bad input refused with exit 2 and the path of the bad field."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from controller.cli.offline import split_cost_command

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLE = REPO / "examples" / "split-cost.json"

# examples/split-cost.json by hand. VM: 16 vCPUs, 64 GB, 1 GPU, $2.98 for the hour,
# default weights: Σ w·c = 0.9·16 + 0.1·64 + 9·1 = 29.8, unit cost $0.10; CPU costs
# $1.44 ($0.09 a vCPU), memory $0.64 ($0.01 a GB), the GPU $0.90.
#   job      allocated (cpus, GB, gpus) = max(reserved, used)
#   train-0  max(4, 3.5) = 4,  max(16, 20) = 20, 1
#   prep-1   max(4, 8) = 8,    max(12, 9) = 12,  0
#   eval-2   6, 8, 0           (no usage measured: the reservation)
# vCPUs: 18 allocated of 16: over-allocated, ratios of 18 ($0.08 a vCPU), none unused:
#   split 0.32, 0.64, 0.48.
# Memory: 40 of 64, unused ratio 0.375: split 0.20, 0.12, 0.08; the unused $0.24 is
#   shared 20:12:8 (ratio / (1 - 0.375)): 0.12, 0.072, 0.048.
# GPU: train-0 holds it: 0.90.
EXPECTED = {
    "train-0": {"split": 1.42, "unused": 0.12, "total": 1.54, "allocated": (4, 20, 1)},
    "prep-1": {"split": 0.76, "unused": 0.072, "total": 0.832, "allocated": (8, 12, 0)},
    "eval-2": {"split": 0.56, "unused": 0.048, "total": 0.608, "allocated": (6, 8, 0)},
}


def check_example_report(report: dict) -> None:
    assert [job["id"] for job in report["jobs"]] == list(EXPECTED)
    for job in report["jobs"]:
        want = EXPECTED[job["id"]]
        assert job["split_cost_usd"] == pytest.approx(want["split"], rel=1e-12)
        assert job["unused_cost_usd"] == pytest.approx(want["unused"], rel=1e-12)
        assert job["total_cost_usd"] == pytest.approx(want["total"], rel=1e-12)
        allocated = job["allocated"]
        assert (allocated["cpus"], allocated["memory_gb"], allocated["gpus"]) == want["allocated"]
    assert report["unallocated_cost_usd"] == 0
    assert math.isclose(report["total_cost_usd"], 2.98, rel_tol=1e-12)
    parts = [job["total_cost_usd"] for job in report["jobs"]] + [report["unallocated_cost_usd"]]
    assert math.isclose(math.fsum(parts), report["vm"]["cost_usd"], rel_tol=1e-12)
    assert report["unit_cost_usd"] == pytest.approx(0.1, rel=1e-12)
    cpus, memory = report["resources"]["cpus"], report["resources"]["memory_gb"]
    assert (cpus["allocated"], cpus["total"], cpus["unused_ratio"]) == (18, 18, 0)
    assert memory["unused_ratio"] == 0.375
    assert memory["unused_cost_usd"] == pytest.approx(0.24, rel=1e-12)
    assert report["resources"]["gpus"]["price_usd"] == pytest.approx(0.9, rel=1e-12)


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(split_cost_command, list(args), input=stdin)


def test_example_file_as_json():
    result = run(str(EXAMPLE), "--format", "json")
    assert result.exit_code == 0, result.output
    check_example_report(json.loads(result.stdout))


def test_json_flag_is_format_json():
    assert run(str(EXAMPLE), "--json").stdout == run(str(EXAMPLE), "--format", "json").stdout


def test_example_file_as_a_table():
    result = run(str(EXAMPLE))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "16 vCPUs, 64 GB memory, 1 GPU; $2.9800 over 1 h" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.strip()}
    assert rows["train-0"][1:8] == ["4", "20", "1", "1.4200", "0.1200", "1.5400", "51.7%"]
    assert rows["prep-1"][5:7] == ["0.0720", "0.8320"]
    assert rows["total"][1:8] == ["18/16", "40/64", "1/1", "2.7400", "0.2400", "2.9800", "100.0%"]
    assert "unallocated" not in result.stdout
    assert "vCPUs: 18 allocated of 16, no unused cost" in result.stdout
    assert "memory GB: 37.5% unused, $0.2400 (shared by utilisation)" in result.stdout


def test_standard_input():
    result = run("-", "--json", stdin=EXAMPLE.read_text())
    assert result.exit_code == 0, result.output
    check_example_report(json.loads(result.stdout))


@pytest.mark.processes
def test_real_process_on_the_example_file():
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from controller.cli.offline import split_cost_command; split_cost_command()",
            "examples/split-cost.json",
            "--format",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    check_example_report(json.loads(completed.stdout))


def test_registered_as_split_cost_on_a_group():
    group = click.Group("spotbag")
    group.add_command(split_cost_command)
    assert split_cost_command.name == "split-cost"
    result = CliRunner().invoke(group, ["split-cost", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    check_example_report(json.loads(result.stdout))


def test_help_documents_the_input_format():
    result = run("--help")
    assert result.exit_code == 0
    for text in ('"cost_usd": 2.98', "vm.hours", "jobs[].used.*", "max(reserved, used)"):
        assert text in result.stdout


def write(tmp_path: Path, data) -> str:
    path = tmp_path / "input.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def vm(**changes):
    return {"cpus": 16, "memory_gb": 64, "gpus": 1, "cost_usd": 2.98, **changes}


def job(**changes):
    return {"id": "a", "reserved": {"cpus": 4, "memory_gb": 8}, **changes}


def test_no_jobs_is_all_unallocated(tmp_path):
    result = run(write(tmp_path, {"vm": vm(), "jobs": []}), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["jobs"] == []
    assert report["unallocated_cost_usd"] == pytest.approx(2.98, rel=1e-12)
    table = run(write(tmp_path, {"vm": vm(), "jobs": []}))
    assert "unallocated (idle)" in table.stdout and "100.0%" in table.stdout


def test_an_idle_gpu_is_unallocated_and_the_rest_is_shared(tmp_path):
    data = {"vm": vm(), "jobs": [job(), job(id="b")]}
    result = run(write(tmp_path, data), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["unallocated_cost_usd"] == pytest.approx(0.9, rel=1e-12)  # the GPU
    a, b = (j["total_cost_usd"] for j in report["jobs"])
    assert a == pytest.approx(b) == pytest.approx((2.98 - 0.9) / 2, rel=1e-12)
    assert (
        "GPUs: 100.0% unused, $0.9000 (no job holds any: unallocated)"
        in run(write(tmp_path, data)).stdout
    )


def test_weights_gpus_and_hours_are_optional_and_weights_configurable(tmp_path):
    data = {
        "vm": {"cpus": 4, "memory_gb": 16, "cost_usd": 2.0, "hours": 2},
        "weights": {"cpu": 9, "memory": 1},
        "jobs": [job(reserved={"cpus": 4, "memory_gb": 16})],
    }
    report = json.loads(run(write(tmp_path, data), "--json").stdout)
    assert report["weights"] == {"cpu": 9, "memory": 1, "gpu": 9}
    assert report["vm"]["gpus"] == 0
    assert report["unit_cost_usd"] == pytest.approx(2 / 52)
    assert report["resources"]["cpus"]["price_per_hour_usd"] == pytest.approx(9 / 52)
    assert report["jobs"][0]["total_cost_usd"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes"),
        ('"a string"', "must be a JSON object, got the string 'a string'"),
        ({"jobs": []}, "vm: required field missing"),
        ({"vm": vm(), "jobs": [], "extra": 1}, "extra: unknown field"),
        ({"vm": {"cpus": 1, "memory_gb": 1}, "jobs": []}, "vm.cost_usd: required field missing"),
        (
            {"vm": vm(memory_gb="64"), "jobs": []},
            "vm.memory_gb: must be a number, got the string '64'",
        ),
        ({"vm": vm(cpus=-16), "jobs": []}, "vm.cpus: must not be negative, got -16"),
        ({"vm": vm(gpus=True), "jobs": []}, "vm.gpus: must be a number, got true"),
        ({"vm": vm(cost_usd=None), "jobs": []}, "vm.cost_usd: must be a number, got null"),
        ({"vm": vm(hours=0), "jobs": []}, "vm.hours: must be more than 0"),
        (
            '{"vm": {"cpus": NaN, "memory_gb": 1, "cost_usd": 1}, "jobs": []}',
            "vm.cpus: must be a finite number",
        ),
        (
            '{"vm": {"cpus": 1e999, "memory_gb": 1, "cost_usd": 1}, "jobs": []}',
            "vm.cpus: must be a finite number",
        ),
        ({"vm": vm(cpus=0, memory_gb=0, gpus=0), "jobs": []}, "vm: nothing to split the cost by"),
        ({"vm": vm(), "weights": {"gpus": 9}, "jobs": []}, "weights.gpus: unknown field"),
        ({"vm": vm(), "weights": {"cpu": -1}, "jobs": []}, "weights.cpu: must not be negative"),
        ({"vm": vm()}, "jobs: required field missing"),
        ({"vm": vm(), "jobs": {"a": {}}}, "jobs: must be a list, got an object"),
        ({"vm": vm(), "jobs": [job(), 3]}, "jobs[1]: must be a JSON object, got 3"),
        ({"vm": vm(), "jobs": [{"reserved": {}}]}, "jobs[0].id: required field missing"),
        ({"vm": vm(), "jobs": [job(id="")]}, "jobs[0].id: must be a non-empty string"),
        ({"vm": vm(), "jobs": [job(), job()]}, "jobs[1].id: duplicate id 'a' (also jobs[0])"),
        ({"vm": vm(), "jobs": [{"id": "a"}]}, "jobs[0].reserved: required field missing"),
        (
            {"vm": vm(), "jobs": [job(), job(id="b", reserved={"cpus": -4})]},
            "jobs[1].reserved.cpus: must not be negative, got -4",
        ),
        (
            {"vm": vm(), "jobs": [job(reserved={"memory": 8})]},
            "jobs[0].reserved.memory: unknown field",
        ),
        ({"vm": vm(), "jobs": [job(used={"cpus": "3"})]}, "jobs[0].used.cpus: must be a number"),
        (
            {"vm": vm(), "jobs": [job(used=[3, 8])]},
            "jobs[0].used: must be a JSON object, got a list",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path, content, expected):
    path = write(tmp_path, content)
    result = run(path)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}: ")
    assert expected in result.stderr


def test_a_missing_file_exits_2(tmp_path):
    path = str(tmp_path / "nope.json")
    result = run(path)
    assert result.exit_code == 2
    assert f"error: {path}: cannot read the file: No such file or directory" in result.stderr


def test_a_file_that_is_not_text_exits_2(tmp_path):
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00")
    result = run(str(path))
    assert result.exit_code == 2
    assert "not JSON" in result.stderr


def test_unmeasured_and_null_usage_count_the_reservation(tmp_path):
    data = {"vm": vm(), "jobs": [job(used={"cpus": None}), job(id="b", used=None)]}
    report = json.loads(run(write(tmp_path, data), "--json").stdout)
    for entry in report["jobs"]:
        assert entry["allocated"] == {"cpus": 4, "memory_gb": 8, "gpus": 0}
