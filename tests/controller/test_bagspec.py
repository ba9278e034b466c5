"""Bag specs: expansion, rendering, and errors that name the field."""

from __future__ import annotations

import shlex

import pytest
from pydantic import ValidationError

from controller.bags.job_command import job_environment, render_command
from controller.bags.spec import BagSpec, BagSpecError, parse_bag

BASE = {"account": "lab", "command": "prog", "max_runtime_s": 60}


def spec(**extra):
    return {**BASE, **extra}


def error_of(data, **kwargs) -> BagSpecError:
    with pytest.raises(BagSpecError) as caught:
        parse_bag(data, **kwargs)
    return caught.value


def test_product_of_lists_and_ranges_in_declaration_order():
    bag = parse_bag(
        spec(command="prog {a} {b}", parameters={"a": [1, 2], "b": {"range": [0.1, 0.4, 0.1]}})
    )
    assert bag.job_count == 6
    assert list(bag.points()) == [
        {"a": 1, "b": 0.1},
        {"a": 1, "b": 0.2},
        {"a": 1, "b": 0.3},
        {"a": 2, "b": 0.1},
        {"a": 2, "b": 0.2},
        {"a": 2, "b": 0.3},
    ]


def test_ranges_exclude_stop_and_keep_integers():
    bag = parse_bag(
        spec(
            parameters={
                "i": {"range": [0, 10, 3]},
                "j": {"range": [5, 0, -2]},
                "k": {"range": [0, 3]},
            }
        )
    )
    assert bag.axes == {"i": [0, 3, 6, 9], "j": [5, 3, 1], "k": [0, 1, 2]}
    assert all(isinstance(v, int) for v in bag.axes["i"])


def test_explicit_points_and_the_single_job_bag():
    points = [{"x": 1, "name": "a"}, {"x": 2, "name": "b b"}]
    bag = parse_bag(spec(command="prog {name}", points=points))
    assert bag.job_count == 2 and list(bag.points()) == points
    single = parse_bag(spec())
    assert single.job_count == 1 and list(single.points()) == [{}]


def test_commands_are_shell_quoted_and_format_specs_apply():
    assert (
        render_command(
            "echo {s} {r:.2f} {flag}", {"s": "a b; rm -rf /", "r": 3.14159, "flag": True}
        )
        == "echo 'a b; rm -rf /' 3.14 true"
    )
    assert shlex.split(render_command("x {v}", {"v": "$(whoami)"})) == ["x", "$(whoami)"]
    assert render_command("awk '{{print $1}}' {f}", {"f": "in.txt"}) == "awk '{print $1}' in.txt"


def test_environment_of_a_job():
    env = job_environment(
        bag_id="b1",
        job_id="b1-3",
        attempt=2,
        checkpoint_dir="/ck",
        params={"alpha": 0.5, "n": 3},
        extra={"OMP_NUM_THREADS": "1"},
    )
    assert env == {
        "OMP_NUM_THREADS": "1",
        "SPOTBAG_BAG_ID": "b1",
        "SPOTBAG_JOB_ID": "b1-3",
        "SPOTBAG_ATTEMPT": "2",
        "SPOTBAG_CHECKPOINT_DIR": "/ck",
        "SPOTBAG_PARAM_ALPHA": "0.5",
        "SPOTBAG_PARAM_N": "3",
    }


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (spec(max_runtime_s=0), "max_runtime_s", "greater than or equal to 1"),
        (spec(max_runtime_s=True), "max_runtime_s", "valid number"),
        ({"command": "x", "max_runtime_s": 1}, "account", "missing"),
        (spec(account="has space"), "account", "pattern"),
        (spec(resources={"cpus": 1.5}), "resources.cpus", "integer"),
        (spec(resources={"gpu": 1}), "resources.gpu", "unknown field"),
        (spec(checkpointable="yes"), "checkpointable", "boolean"),
        (spec(parameters={"a": []}), "parameters.a", "no values"),
        (spec(parameters={"a": [1, [2]]}), "parameters.a[1]", "strings, numbers or booleans"),
        (spec(parameters={"a": {"range": [0, 1, 0]}}), "parameters.a.range", "step must not be 0"),
        (spec(parameters={"a": {"range": [0, "9"]}}), "parameters.a.range", "finite numbers"),
        (spec(parameters={"a": {"range": [0.5, 10**400]}}), "parameters.a.range", "too large"),
        (spec(parameters={"a": {"from": 0}}), "parameters.a", "range"),
        (spec(parameters={"1a": [1]}), "parameters.1a", "identifier"),
        (spec(parameters={"a": [1], "A": [2]}), "parameters", "SPOTBAG_PARAM_A"),
        (spec(parameters={"a": [1]}, points=[{"a": 1}]), "points", "not both"),
        (spec(points=[{"a": 1}, {"b": 2}]), "points[1]", "points[0] has"),
        (spec(command="x {b}", parameters={"a": [1]}), "command", "{b} is not a parameter"),
        (spec(command="echo ${HOME}"), "command", "for the shell's ${HOME} write ${{HOME}}"),
        (spec(command="x {a!r}", parameters={"a": [1]}), "command", "conversions"),
        (spec(command="x {a", parameters={"a": [1]}), "command", "placeholder syntax"),
        (spec(command="x {a:d}", parameters={"a": ["s"]}), "command", "cannot format job 0"),
        (spec(command="x {a:.2f}", parameters={"a": [10**400]}), "command", "too large"),
        (spec(command="x {a:c}", points=[{"a": 10**10}]), "command", "not in range"),
        (spec(env={"SPOTBAG_JOB_ID": "x"}), "env.SPOTBAG_JOB_ID", "set by spotbag"),
        (spec(estimated_runtime_s=100), "estimated_runtime_s", "exceeds max_runtime_s"),
        (spec(retryable_exit_codes=[0]), "retryable_exit_codes[0]", "1..255"),
        (
            spec(parameters={"a": [1]}, estimated_runtime_param="t"),
            "estimated_runtime_param",
            "'t' is not a parameter (they are: a)",
        ),
        (
            spec(points=[{"t": 30}, {"t": "long"}], estimated_runtime_param="t"),
            "points[1].t",
            "needs a runtime in seconds, 1 to max_runtime_s (60)",
        ),
        (
            spec(parameters={"t": {"range": [10, 100, 10]}}, estimated_runtime_param="t"),
            "parameters.t",
            "is 70: estimated_runtime_param needs a runtime",
        ),
    ],
)
def test_errors_name_the_field(data, field, words):
    error = error_of(data)
    assert error.problems[0].field == field
    assert words in error.problems[0].message
    assert str(error).startswith(f"{field}: ")


def test_each_job_may_carry_its_own_estimated_runtime():
    bag = parse_bag(spec(points=[{"t": 30}, {"t": 60.0}], estimated_runtime_param="t"))
    assert bag.spec.estimated_runtime_param == "t" and bag.job_count == 2


def test_the_job_limit_is_checked_before_expanding():
    error = error_of(
        spec(parameters={"a": {"range": [0, 1000]}, "b": {"range": [0, 1000]}}), max_jobs=999_999
    )
    assert error.problems[0].field == "parameters"
    assert "1,000,000 jobs; at most 999,999" in error.problems[0].message


def test_all_problems_are_reported_at_once():
    error = error_of(spec(max_runtime_s=-1, resources={"cpus": 0}))
    assert {p.field for p in error.problems} == {"max_runtime_s", "resources.cpus"}
    assert "(and 1 more)" in str(error)


TINY = 2.2250738585072014e-308  # the smallest normal float; 1e-320 is denormal
HUGE = float("1e999")  # what JSON's 1e999 decodes to: infinity


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        # Runtimes are at least a second (issue 23: a denormal one passed gt=0).
        (spec(max_runtime_s=TINY), "max_runtime_s", "greater than or equal to 1"),
        (spec(max_runtime_s=1e-320), "max_runtime_s", "greater than or equal to 1"),
        (spec(max_runtime_s=0.999), "max_runtime_s", "greater than or equal to 1"),
        (spec(max_runtime_s=HUGE), "max_runtime_s", "finite number"),
        (spec(max_runtime_s=-HUGE), "max_runtime_s", "finite number"),
        (spec(max_runtime_s=30 * 86_400 + 1), "max_runtime_s", "less than or equal to 2592000"),
        (spec(estimated_runtime_s=1e-320), "estimated_runtime_s", "greater than or equal to 1"),
        (spec(estimated_runtime_s=HUGE), "estimated_runtime_s", "finite number"),
        (spec(simulation={"runtime_s": 0.5}), "simulation.runtime_s", "greater than or equal to 1"),
        (spec(simulation={"runtime_cv": HUGE}), "simulation.runtime_cv", "finite number"),
        (spec(simulation={"failure_probability": 1.5}), "simulation.failure_probability", "1"),
        (spec(checkpoint_cost_s=5e-324), "checkpoint_cost_s", "greater than or equal to 0.001"),
        (spec(checkpoint_cost_s=HUGE), "checkpoint_cost_s", "finite number"),
        (spec(resources={"memory_gb": HUGE}), "resources.memory_gb", "finite number"),
        # Integer fields: a float with a fraction, or infinity, is refused with its value.
        (spec(resources={"cpus": 1699.5}), "resources.cpus", "an integer, not 1699.5"),
        (spec(resources={"cpus": HUGE}), "resources.cpus", "an integer, not inf"),
        (spec(resources={"gpus": 0.5}), "resources.gpus", "an integer, not 0.5"),
        (spec(max_attempts=2.5), "max_attempts", "an integer, not 2.5"),
        (spec(max_attempts=1e300), "max_attempts", "less than or equal to 100"),
        (spec(retryable_exit_codes=[75.5]), "retryable_exit_codes[0]", "an integer"),
        (spec(retryable_exit_codes=[256.0]), "retryable_exit_codes[0]", "1..255"),
        (spec(retryable_exit_codes=list(range(1, 256)) * 2), "retryable_exit_codes", "at most 255"),
        (spec(simulation={"failure_exit_code": 1.5}), "simulation.failure_exit_code", "an integer"),
        # ...and the strict types still hold for them.
        (spec(max_attempts="3"), "max_attempts", "valid integer"),
        (spec(max_attempts=True), "max_attempts", "valid integer"),
        (spec(resources={"cpus": "2"}), "resources.cpus", "valid integer"),
    ],
)
def test_numbers_are_finite_bounded_and_integral_where_the_schema_says(data, field, words):
    error = error_of(data)
    assert [p.field for p in error.problems] == [field], error.problems
    assert words in error.problems[0].message, error.problems[0].message


def test_integral_floats_are_the_integers_they_stand_for():
    # JSON Schema's "integer" (what /openapi.json says) includes 1699.0.
    bag = parse_bag(
        spec(
            resources={"cpus": 1699.0, "gpus": 1.0},
            max_attempts=3.0,
            retryable_exit_codes=[75.0, 3],
            simulation={"failure_exit_code": 2.0},
        )
    )
    assert bag.spec.resources.cpus == 1699 and type(bag.spec.resources.cpus) is int
    assert bag.spec.resources.gpus == 1 and type(bag.spec.resources.gpus) is int
    assert bag.spec.max_attempts == 3 and type(bag.spec.max_attempts) is int
    assert bag.spec.retryable_exit_codes == [75, 3]
    assert all(type(code) is int for code in bag.spec.retryable_exit_codes)
    assert bag.spec.simulation is not None and bag.spec.simulation.failure_exit_code == 2
    # Stored and shown as integers: the spec's JSON says 1699, not 1699.0.
    assert '"cpus":1699,' in bag.spec.model_dump_json()
    # The bounds themselves are accepted: a second, 1 ms of checkpoint.
    parse_bag(spec(max_runtime_s=1, estimated_runtime_s=1.0, checkpoint_cost_s=0.001))


def test_a_schema_problem_elsewhere_does_not_make_the_placeholders_unknown():
    error = error_of(spec(command="prog {x}", parameters={"x": [1]}, max_runtime_s=1e-320))
    assert [p.field for p in error.problems] == ["max_runtime_s"]


def test_a_stored_spec_admitted_under_looser_bounds_is_still_read_back():
    # A bag admitted before runtimes had to be 1 s or more: a restart recovers it.
    stored = parse_bag(spec(resources={"cpus": 2}, simulation={"runtime_cv": 0.5}))
    text = stored.spec.model_dump_json(exclude={"points"}).replace(
        '"max_runtime_s":60.0', '"max_runtime_s":0.5'
    )
    assert '"max_runtime_s":0.5' in text
    with pytest.raises(ValidationError):
        BagSpec.model_validate_json(text)
    old = BagSpec.from_stored(text)
    assert old.max_runtime_s == 0.5 and old.resources.cpus == 2 and old.account == "lab"
    assert old.simulation is not None and old.simulation.runtime_cv == 0.5
    assert old.model_dump_json(exclude={"points"}) == text  # the same spec, field for field
    # One that passes today's checks is validated as usual.
    assert BagSpec.from_stored(stored.spec.model_dump_json()) == stored.spec


@pytest.mark.parametrize(
    ("data", "field"),
    [
        # `$` in re.match lets a final newline through: names are matched whole.
        (spec(env={"A\n": "1"}), "env.A\n"),
        (spec(env={"\nA": "1"}), "env.\nA"),
        (spec(command="prog", parameters={"x\n": [1]}), "parameters.x\n"),
        (spec(command="prog", points=[{"x\n": 1}]), "points[0].x\n"),
        (spec(account="lab\n"), "account"),
    ],
)
def test_names_with_a_trailing_newline_are_refused(data, field):
    error = error_of(data)
    assert [p.field for p in error.problems] == [field], error.problems
