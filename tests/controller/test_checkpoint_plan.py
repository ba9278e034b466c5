"""`spotbag checkpoint-plan`: durations, models, the schedules it prints, and its errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from controller.cli import cli
from controller.tools.checkpoint_plan import (
    PlanError,
    PlanRequest,
    parse_duration_h,
    plan,
    render,
    resolve_model,
)
from policies.checkpoint import expected_makespan


@pytest.mark.parametrize(
    ("text", "hours"),
    [
        ("5h", 5.0),
        ("90m", 1.5),
        ("90min", 1.5),
        ("1h30m", 1.5),
        ("1h 30m", 1.5),
        ("45s", 45 / 3600),
        ("1.5d", 36.0),
        ("2", 2.0),
        ("0.25", 0.25),
        (".5h", 0.5),
    ],
)
def test_durations(text, hours):
    assert parse_duration_h(text) == pytest.approx(hours)


@pytest.mark.parametrize("text", ["", "5x", "h", "5h junk", "junk 5h", "-", "1h-2m"])
def test_bad_durations_say_what_to_write(text):
    with pytest.raises(PlanError, match=r"write e\.g\. 5h"):
        parse_duration_h(text, "--work")


def test_the_plan_for_a_five_hour_job_on_the_shipped_n1_model():
    model, key = resolve_model("gce/n1-highcpu-16")
    assert key == "gce/n1-highcpu-16"
    request = PlanRequest(model, key, 5.0, 1 / 60, compare=("young-daly", "none", "periodic:30m"))
    optimal, young_daly, none, periodic = plan(request)
    # Growing intervals, under 5% overhead, better than every other policy.
    assert list(optimal.intervals_h) == sorted(optimal.intervals_h)
    assert optimal.intervals_h[-2] > optimal.intervals_h[0]
    assert optimal.overhead < 0.05
    for other in (young_daly, none, periodic):
        assert optimal.expected_makespan_h <= other.expected_makespan_h
    assert none.checkpoints == 0 and periodic.intervals_h[0] == pytest.approx(0.5)
    assert young_daly.policy.startswith("young-daly")
    assert sum(optimal.intervals_h) == pytest.approx(5.0)
    # The printed expectation is the exact evaluator's.
    assert none.expected_makespan_h == pytest.approx(expected_makespan(model, [5.0], 1 / 60))
    text = render(request, [optimal, young_daly])
    assert "optimal: expected makespan" in text and "overhead 4." in text


def test_unknown_models_and_bad_requests_are_refused():
    with pytest.raises(PlanError, match=r"known: .*gce/n1-highcpu-16"):
        resolve_model("aws/m5.large")
    # A zone without enough lifetimes of its own falls back to its type's model.
    assert resolve_model("gce/n1-highcpu-16/europe-west1-b")[1] == "gce/n1-highcpu-16"
    model, key = resolve_model("gce/n1-highcpu-16")
    for request, problem in [
        (PlanRequest(model, key, 0.0, 1 / 60), "--work must be positive"),
        (PlanRequest(model, key, 5.0, -1.0), "--delta must not be negative"),
        (PlanRequest(model, key, 5.0, 1 / 60, compare=("daly",)), "--compare 'daly'"),
        (PlanRequest(model, key, 5.0, 1 / 60, step_h=1e-6), "100,000 steps"),
    ]:
        with pytest.raises(PlanError, match=problem):
            plan(request)


def spotbag(*args: str) -> Result:
    """The command in this process (its process is tested in tests/integration/test_cli.py)."""
    return CliRunner().invoke(cli, list(args))


def test_the_command_prints_json_and_refuses_bad_input(tmp_path):
    out = spotbag(
        "--state-dir",
        str(tmp_path),
        "checkpoint-plan",
        "--model",
        "gce/n1-highcpu-16",
        "--work",
        "4h",
        "--age",
        "12h",
        "--compare",
        "young-daly",
        "--mttf",
        "1h",
        "--json",
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    optimal, young_daly = data["policies"]
    assert data["work_h"] == 4.0 and data["start_age_h"] == 12.0
    assert optimal["expected_overhead"] < young_daly["expected_overhead"]
    assert young_daly["policy"] == "young-daly (mttf 1 h)"
    assert len(optimal["checkpoint_times_h"]) == optimal["checkpoints"]
    # The table was cached in the state directory for the next call (and the daemon).
    assert list((tmp_path / "checkpoint-tables").glob("*.npz"))
    bad = spotbag("checkpoint-plan", "--model", "gce/n1-highcpu-16", "--work", "4 hours")
    assert bad.exit_code == 2 and "--work: cannot read '4 hours'" in bad.stderr
    unknown = spotbag("checkpoint-plan", "--model", "aws/m5.large", "--work", "4h")
    assert unknown.exit_code == 2 and "no model for 'aws/m5.large'" in unknown.stderr
