"""Bag specs (docs/design.md#bags): the model, its validation, and its expansion into jobs.

A bag is one command template run over a parameter space:

- `parameters`: named axes, each a list of values or `{"range": [start, stop, step]}`
  (stop excluded, as in Python's range); the jobs are their cartesian product,
  in declaration order with the last axis varying fastest;
- or `points`: an explicit list of `{name: value}` objects, all with the same names;
- neither: a bag of one job.

`{name}` placeholders in the command are filled per job, shell-quoted (an
optional format spec such as `{r:.3f}` is applied first); every value is also
exported as `SPOTBAG_PARAM_<NAME>` (controller/bags/job_command.py). Errors name the field they
are about (`parameters.r`, `resources.cpus`, ...).

The spec's structure, types and bounds are the pydantic model's (BagSpec, whose JSON
schema /openapi.json shows); what a schema cannot say, or would take seconds to check
value by value for a million jobs (parameter axes and points, placeholders, sizes),
is plain code over the whole bag at once.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import reprlib
import string
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from controller.bags.job_command import ParamValue, param_env_name, render_command, size_problem
from controller.errors import SpotbagError
from controller.notify.kinds import ALL_EVENT_KINDS, EVENT_KINDS, EventKind

PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ACCOUNT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_RUNTIME_S = 30 * 86_400.0
# Runtimes (max_runtime_s, estimated_runtime_s, simulation.runtime_s) are at least a
# second: no program starts, runs and is reported in less, and a runtime of 1e-320 s
# made reservations so small that dividing a balance by one overflowed (issue 23).
MIN_RUNTIME_S = 1.0
# Writing a checkpoint may be quick (the tests and the demo, on a time-compressed
# clock, take 10-50 ms), but not denormal: 1 ms.
MIN_CHECKPOINT_COST_S = 0.001
# Each value goes into the environment: Linux refuses any single one above 128 KiB
# (MAX_ARG_STRLEN). The limits of a whole job are controller/bags/job_command.py's.
MAX_VALUE_CHARS = 100_000
MAX_FORMAT_WIDTH = 1000
MIN_MEMORY_GB = 0.001  # 1 MB: smaller is a mistake, and a tiny divisor overflows packing
# A deadline given as a duration from submission: "36h", "90m", "2d", "1h30m", "3600s".
DURATION = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?[smhdw])+$")
DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
MAX_DEADLINE_S = 366 * 86_400.0  # a year from submission at most
MAX_BUDGET_USD = 1e9
MIN_BUDGET_USD = 0.01  # a cent: smaller is a mistake (and no attempt costs less)
MAX_WEBHOOKS = 10


@dataclass(frozen=True)
class FieldProblem:
    field: str  # dotted path into the spec, e.g. "parameters.r" or "resources.cpus"
    message: str


class BagSpecError(SpotbagError, ValueError):
    """A bag spec that cannot be accepted; `problems` lists every field at fault."""

    status = 400
    code = "invalid_bag"
    exit_code = 2

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{first.field}: {first.message}{more}")

    @classmethod
    def one(cls, field: str, message: str) -> BagSpecError:
        return cls([FieldProblem(field, message)])


def _whole(value: Any) -> Any:
    """A float with no fractional part as the int it is: JSON has one number type, and
    JSON Schema's "integer" (what /openapi.json says) includes 1699.0, which some
    encoders write for 1699. Any other float is refused with the value given; other
    types are left to the strict check (no "2" for 2, no true for 1)."""
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError(f"must be an integer, not {value!r}")
    return value


# An integer field: strict, except that an integral float counts (see _whole).
Integer = Annotated[int, BeforeValidator(_whole)]


def _exit_code(code: int) -> int:
    # A validator rather than Field(ge=1, le=255): the message says what exit codes are.
    if not 1 <= code <= 255:
        raise ValueError("exit codes are 1..255")
    return code


ExitCode = Annotated[
    int,
    BeforeValidator(_whole),
    AfterValidator(_exit_code),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 255}),
]


class _Strict(BaseModel):
    """Strict types (no "1" for 1, no 1 for true) and finite numbers: a JSON number too
    large for a float (1e999) decodes as infinity, refused here by name."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class Resources(_Strict):
    cpus: Integer = Field(1, ge=1, le=4096, description="vCPUs each job needs.")
    gpus: Integer = Field(0, ge=0, le=64, description="GPUs each job needs.")
    memory_gb: float = Field(
        1.0, ge=MIN_MEMORY_GB, le=65536, description="Memory each job needs, in GB."
    )
    vm_types: list[str] | None = Field(
        None, min_length=1, description="Only these VM types may run the jobs."
    )
    regions: list[str] | None = Field(
        None, min_length=1, description="Only VMs in these zones/regions may run the jobs."
    )


class SimulationHints(_Strict):
    """How `spotbag simulate` should pretend each job behaves."""

    runtime_s: float | None = Field(
        None,
        ge=MIN_RUNTIME_S,
        le=MAX_RUNTIME_S,
        description="Runtime of each job (default: estimated_runtime_s).",
    )
    runtime_cv: float = Field(
        0.0, ge=0, le=10, description="Coefficient of variation of a lognormal runtime."
    )
    runtime_param: str | None = Field(
        None,
        min_length=1,
        description="Each job's runtime, seconds, is its value of this parameter (jobs of "
        "different lengths; before runtime_cv); a job without it takes runtime_s.",
    )
    failure_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that an attempt exits non-zero."
    )
    failure_exit_code: Integer = Field(
        1, ge=1, le=255, description="Exit code of a failing attempt."
    )


def duration_s(text: str) -> float | None:
    """Seconds of a duration such as "36h" or "1h30m" (s, m, h, d, w), or None when
    `text` is not one."""
    if not DURATION.fullmatch(text):
        return None
    return sum(float(n) * UNIT_S[unit] for n, unit in DURATION_PART.findall(text))


def instant_s(text: str) -> float | None:
    """Epoch seconds of an ISO 8601 instant with its offset ("2026-11-27T09:00:00Z",
    "...+01:00"), or None when `text` is not one (a time without an offset is refused:
    whose 9:00?)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp()


def _deadline(value: str | None) -> str | None:
    if value is None:
        return value
    seconds = duration_s(value)
    if seconds is not None:
        if not 0 < seconds <= MAX_DEADLINE_S:
            raise ValueError(
                f"a duration from submission of more than 0 s and at most 366 days, not {value!r}"
            )
        return value
    if instant_s(value) is None:
        raise ValueError(
            f"must be an ISO 8601 instant with its offset (2026-11-27T09:00:00Z) or a "
            f"duration from submission (36h, 90m, 2d, 1h30m), not {value!r}"
        )
    return value


def _webhook_url(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, not {url!r}")
    return url


class Webhook(_Strict):
    """Where to POST events, and which."""

    url: Annotated[str, AfterValidator(_webhook_url)] = Field(
        min_length=1, max_length=2000, description="http(s) URL the events are POSTed to."
    )
    events: list[EventKind] = Field(
        default_factory=lambda: list(ALL_EVENT_KINDS),
        min_length=1,
        max_length=len(EVENT_KINDS),
        description="Kinds of event to send (default: all): " + ", ".join(EVENT_KINDS) + ".",
    )


class BagSpec(_Strict):
    name: str = Field("", max_length=200, description="Human-readable name.")
    account: str = Field(pattern=ACCOUNT_NAME, description="Account the bag is charged to.")
    command: str = Field(
        min_length=1,
        max_length=100_000,
        description="Shell command template with {param} placeholders.",
    )
    parameters: dict[str, Any] | None = Field(
        None, description='Named axes: a list of values or {"range": [start, stop, step]}.'
    )
    points: list[dict[str, Any]] | None = Field(
        None, description="Explicit parameter points instead of a product."
    )
    resources: Resources = Field(default_factory=Resources)
    max_runtime_s: float = Field(
        ge=MIN_RUNTIME_S,
        le=MAX_RUNTIME_S,
        description="Longest an attempt may run, seconds; what the ledger reserves.",
    )
    estimated_runtime_s: float | None = Field(
        None,
        ge=MIN_RUNTIME_S,
        le=MAX_RUNTIME_S,
        description="Expected runtime of a job, seconds, if known.",
    )
    estimated_runtime_param: str | None = Field(
        None,
        min_length=1,
        description="The parameter whose value is each job's estimated runtime, seconds (jobs "
        "of different lengths); a deadline plans each job at it, scaled by what the finished "
        "jobs took against theirs.",
    )
    checkpointable: bool = Field(
        False,
        description="Jobs checkpoint on SIGUSR1 into $SPOTBAG_CHECKPOINT_DIR and resume from it; "
        "the controller signals them on a schedule fitted to their VM's preemption model.",
    )
    checkpoint_cost_s: float = Field(
        60.0,
        ge=MIN_CHECKPOINT_COST_S,
        le=MAX_RUNTIME_S,
        description="How long a job takes to write one checkpoint, seconds (δ of the schedule).",
    )
    on_insufficient_balance: Literal["reject", "hold"] = Field(
        "reject",
        description="When the account cannot reserve CPU-hours for every job: reject the bag "
        "(HTTP 402, nothing admitted), or hold the jobs that do not fit until reservations "
        "are released or the account is credited.",
    )
    max_attempts: Integer = Field(
        5, ge=1, le=100, description="Attempts per job, preemptions included."
    )
    retryable_exit_codes: list[ExitCode] = Field(
        default_factory=list,
        max_length=255,
        description="Non-zero exit codes that mean 'try again'.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables (not SPOTBAG_*). With the command and the "
        "parameter values, at most 128 KiB (MAX_EXEC_BYTES) per job.",
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME.pattern}},
    )
    workdir: str | None = Field(
        None,
        description="Absolute working directory of each job (local executor); the CLI fills in its own.",
        json_schema_extra={"pattern": "^/"},  # what _absolute checks, with a better message
    )
    simulation: SimulationHints | None = None
    deadline: Annotated[str | None, AfterValidator(_deadline)] = Field(
        None,
        max_length=64,
        description="When the bag should be done: an ISO 8601 instant with its offset "
        "(2026-11-27T09:00:00Z) or a duration from submission (36h, 90m, 2d, 1h30m).",
    )
    budget_usd: float | None = Field(
        None,
        ge=MIN_BUDGET_USD,
        le=MAX_BUDGET_USD,
        description="Most the bag may cost, US dollars (spot and on-demand together): "
        "attempts that would pass it do not start, the bag waits (held: budget).",
    )
    on_demand: Literal["never", "when_needed", "always"] | None = Field(
        None,
        description="On-demand VMs: never (spot only), when_needed (to meet the deadline), "
        "always. Default: never without a deadline, when_needed with one.",
    )
    deadline_confidence: float = Field(
        0.95,
        ge=0.5,
        le=0.9999,
        description="With a deadline: the probability with which it should be met.",
    )
    deadline_policy: Literal["spotbag", "uniform_progress"] = Field(
        "spotbag",
        description="With on_demand: when_needed, what decides when on-demand VMs are needed: "
        "spotbag (the deadline policy, from the preemption models; docs/design.md#deadlines) or "
        "uniform_progress (Wu et al., NSDI '24: the baseline, no model of spot lifetimes).",
    )
    notify: list[Webhook] = Field(
        default_factory=list,
        max_length=MAX_WEBHOOKS,
        description="Webhooks told of the bag's events (docs/notifications.md).",
    )

    @property
    def on_demand_mode(self) -> str:
        """on_demand, or its default: when_needed with a deadline, never without."""
        if self.on_demand is not None:
            return self.on_demand
        return "when_needed" if self.deadline is not None else "never"

    def deadline_at(self, submitted_at: float) -> float | None:
        """The deadline in epoch seconds (a duration counts from `submitted_at`)."""
        if self.deadline is None:
            return None
        seconds = duration_s(self.deadline)
        if seconds is not None:
            return submitted_at + seconds
        return instant_s(self.deadline)

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(
                f"must be an absolute path, not {value!r} (relative to what, on the daemon's host?)"
            )
        return value

    @classmethod
    def from_stored(cls, text: str) -> BagSpec:
        """A spec read back from the store (its JSON as admission wrote it). It was valid
        when it was admitted; a bound tightened since (runtimes of at least 1 s, from
        issue 23) must not stop a restart from recovering the bag, so a stored spec that
        today's checks refuse is taken as it was stored."""
        try:
            return cls.model_validate_json(text)
        except ValidationError:
            data = json.loads(text)
        resources = Resources.model_construct(**(data.pop("resources", None) or {}))
        hints = data.pop("simulation", None)
        simulation = SimulationHints.model_construct(**hints) if hints is not None else None
        notify = [Webhook.model_construct(**w) for w in data.pop("notify", None) or ()]
        return cls.model_construct(
            resources=resources, simulation=simulation, notify=notify, **data
        )


@dataclass(frozen=True)
class Bag:
    """A validated spec with its parameter axes resolved (ranges expanded)."""

    spec: BagSpec
    axes: dict[str, list[ParamValue]] | None  # None when `points` (or nothing) is given
    job_count: int

    def points(self) -> Iterator[dict[str, ParamValue]]:
        """Every job's parameters, in job index order."""
        if self.axes is not None:
            names = list(self.axes)
            for combo in itertools.product(*self.axes.values()):
                yield dict(zip(names, combo, strict=True))
        elif self.spec.points is not None:
            yield from self.spec.points
        else:
            yield {}


def parse_bag(data: Any, *, max_jobs: int = 1_000_000) -> Bag:
    """Validate a decoded bag spec; raise BagSpecError naming every field at fault."""
    if not isinstance(data, Mapping):
        raise BagSpecError.one("(body)", "a bag spec must be a JSON object")
    text_problems = _check_text(data)
    if text_problems:
        raise BagSpecError(text_problems)
    try:
        spec = BagSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(err) for err in exc.errors()]
        # Report the other fields' problems too, as far as the raw values allow.
        bad_fields = {p.field.split(".")[0].split("[")[0] for p in problems}
        try:
            raw = BagSpec.model_construct(**{k: v for k, v in data.items() if k not in bad_fields})
            _check_semantics(raw, problems, max_jobs)
        except Exception:  # the raw values are too broken to say more
            pass
        raise BagSpecError(problems) from None
    problems = []
    axes = _check_semantics(spec, problems, max_jobs)
    if problems:
        raise BagSpecError(problems)
    if axes is not None:
        count = math.prod(len(values) for values in axes.values())
    elif spec.points is not None:
        count = len(spec.points)
    else:
        count = 1
    bag = Bag(spec=spec, axes=axes, job_count=count)
    if _has_format_specs(spec.command):
        _check_rendering(bag)
    return bag


def _check_semantics(
    spec: BagSpec, problems: list[FieldProblem], max_jobs: int
) -> dict[str, list] | None:
    """The checks a schema cannot express; returns the resolved parameter axes."""
    axes = _check_parameters(spec, problems, max_jobs)
    if axes is not None:
        names = list(axes)
    elif isinstance(spec.parameters, Mapping) and spec.points is None:
        # Not expanded (a problem here or in another field): the placeholders may
        # still name them, rather than be reported as unknown.
        names = [str(name) for name in spec.parameters]
    else:
        names = _point_names(spec, problems, max_jobs)
    if isinstance(spec.command, str):
        _check_command(spec.command, names, problems)
    _check_env(spec, names, problems)
    _check_runtime_param(spec, names, axes, problems)
    if not problems:
        _check_sizes(spec, axes, problems)
    _check_limits(spec, problems)
    return axes


def _check_text(data: Any) -> list[FieldProblem]:
    """Strings a process cannot take: NUL bytes (they end C strings) and lone UTF-16
    surrogates (not encodable as UTF-8). A fast check of the whole spec first; only
    when it fails, a walk (without recursion) to name the fields."""
    try:
        text = json.dumps(data, ensure_ascii=False)  # a NUL comes out as the escape \u0000
        text.encode("utf-8")
        if "\\u0000" not in text:
            return []
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass
    problems: list[FieldProblem] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack and len(problems) < 20:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                problems.append(FieldProblem(path or "(body)", "contains a NUL byte"))
            elif _has_surrogates(value):
                problems.append(
                    FieldProblem(path or "(body)", "contains invalid unicode (a lone surrogate)")
                )
        elif isinstance(value, Mapping):
            for key, item in value.items():
                stack.append((f"{path}.{key}" if path else str(key), item))
                if isinstance(key, str) and ("\x00" in key or _has_surrogates(key)):
                    problems.append(FieldProblem(path or "(body)", f"has an invalid key {key!r}"))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return sorted(problems, key=lambda p: p.field)


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _problem(err: Mapping[str, Any]) -> FieldProblem:
    loc = ""
    for part in err["loc"]:
        loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
    loc = loc or "(body)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "value_error":
        message = message.removeprefix("Value error, ")
    elif err["type"] == "missing":
        message = "required field is missing"
    return FieldProblem(loc, message)


def _check_value(field: str, value: Any, problems: list[FieldProblem]) -> None:
    if not isinstance(value, ParamValue) or (isinstance(value, float) and not math.isfinite(value)):
        shown = repr(value) if len(repr(value)) < 80 else f"a {type(value).__name__}"
        problems.append(
            FieldProblem(field, f"values must be strings, numbers or booleans, got {shown}")
        )
    elif isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        problems.append(
            FieldProblem(field, f"is {len(value):,} characters; at most {MAX_VALUE_CHARS:,}")
        )


def _check_parameters(
    spec: BagSpec, problems: list[FieldProblem], max_jobs: int
) -> dict[str, list] | None:
    """Validate the axes, count the jobs they make without expanding them, and only
    then expand: a tiny spec can describe an astronomically large bag."""
    if spec.parameters is not None and spec.points is not None:
        problems.append(FieldProblem("points", "give either parameters or points, not both"))
        return None
    if spec.parameters is None:
        return None
    if not isinstance(spec.parameters, Mapping) or not spec.parameters:
        problems.append(FieldProblem("parameters", "must name at least one parameter"))
        return None
    plans: dict[str, tuple[int, Callable[[], list]]] = {}
    for name, axis in spec.parameters.items():
        field = f"parameters.{name}"
        if not PARAM_NAME.fullmatch(name):
            problems.append(
                FieldProblem(
                    field, "a parameter name must be an identifier ([A-Za-z_][A-Za-z0-9_]*)"
                )
            )
            continue
        if isinstance(axis, Mapping):
            plan = _range_plan(field, axis, problems, max_jobs)
        elif isinstance(axis, list):
            for i, value in enumerate(axis):
                _check_value(f"{field}[{i}]", value, problems)
            plan = (len(axis), lambda axis=axis: list(axis))
        else:
            problems.append(
                FieldProblem(field, 'must be a list of values or {"range": [start, stop, step]}')
            )
            continue
        if plan is None:
            continue
        if plan[0] == 0:
            problems.append(FieldProblem(field, "has no values"))
        plans[name] = plan
    _check_name_collisions("parameters", list(plans), problems)
    if problems:
        return None
    count = 1
    for length, _ in plans.values():  # stop as soon as the product is too large
        count *= length
        if count > max_jobs:
            problems.append(
                FieldProblem(
                    "parameters",
                    f"the bag has {_count_text(count, max_jobs)} jobs; at most {max_jobs:,} are "
                    "allowed per bag (split it into several bags)",
                )
            )
            return None
    return {name: expand() for name, (_, expand) in plans.items()}


def _count_text(count: int, limit: int) -> str:
    """A count for a message; one past any sensible limit is only said to be huge (an int
    of thousands of digits cannot even be printed)."""
    return f"{count:,}" if count <= 10**15 else f"more than {max(limit, 10**15):,}"


def _range_plan(
    field: str, axis: Mapping[str, Any], problems: list[FieldProblem], max_jobs: int
) -> tuple[int, Callable[[], list]] | None:
    """(number of values, how to make them) of a {"range": [start, stop, step]} axis,
    counted exactly (Python ints, or floats checked for overflow) without making them."""
    bounds = axis.get("range")
    extra = set(axis) - {"range"}
    if extra or not isinstance(bounds, list) or len(bounds) not in (2, 3):
        problems.append(
            FieldProblem(
                field, 'a range is {"range": [start, stop]} or {"range": [start, stop, step]}'
            )
        )
        return None
    if not all(
        # An int is finite, and may be too large for math.isfinite (10**400: OverflowError).
        isinstance(b, int | float)
        and not isinstance(b, bool)
        and (isinstance(b, int) or math.isfinite(b))
        for b in bounds
    ):
        problems.append(
            FieldProblem(f"{field}.range", "start, stop and step must be finite numbers")
        )
        return None
    start, stop, step = (*bounds, 1) if len(bounds) == 2 else bounds
    if step == 0:
        problems.append(FieldProblem(f"{field}.range", "step must not be 0"))
        return None
    if all(isinstance(b, int) for b in (start, stop, step)):
        # len(range(...)) overflows past sys.maxsize; the same count in exact arithmetic:
        count = max(0, -((start - stop) // step))
        if count > max_jobs:
            problems.append(_too_many_values(field, count, max_jobs))
            return None
        return count, lambda: list(range(start, stop, step))
    try:
        quotient = (stop - start) / step
        if not math.isfinite(quotient):
            raise OverflowError
        count = max(0, math.ceil(quotient - 1e-9))
        # A finite float's exponent is an int (the Literal 'n'/'N'/'F' are NaN and infinity).
        decimals = max(-int(Decimal(repr(float(x))).as_tuple().exponent) for x in (start, step))
    except (OverflowError, ValueError):
        problems.append(
            FieldProblem(
                f"{field}.range",
                "start, stop and step are too large or too small: (stop - start) / step "
                "is not a finite number of values",
            )
        )
        return None
    if count > max_jobs:
        problems.append(_too_many_values(field, count, max_jobs))
        return None
    # Round to the inputs' decimals so that 0.1 steps give 0.3, not 0.30000000000000004.
    return count, lambda: [round(start + k * step, decimals) for k in range(count)]


def _too_many_values(field: str, count: int, max_jobs: int) -> FieldProblem:
    return FieldProblem(
        f"{field}.range",
        f"makes {_count_text(count, max_jobs)} values; a bag has at most {max_jobs:,} jobs "
        "(a larger step, or several bags)",
    )


def _point_names(spec: BagSpec, problems: list[FieldProblem], max_jobs: int) -> list[str]:
    if spec.points is None:
        return []
    if not isinstance(spec.points, list) or not spec.points:
        problems.append(FieldProblem("points", "must list at least one point"))
        return []
    if len(spec.points) > max_jobs:
        problems.append(
            FieldProblem(
                "points",
                f"the bag has {len(spec.points):,} jobs; at most {max_jobs:,} are allowed per bag "
                "(split it into several bags)",
            )
        )
        return []
    names = list(spec.points[0])
    for i, point in enumerate(spec.points):
        if list(point) != names and set(point) != set(names):
            problems.append(
                FieldProblem(
                    f"points[{i}]", f"has parameters {sorted(point)}; points[0] has {sorted(names)}"
                )
            )
            break
        for name, value in point.items():
            _check_value(f"points[{i}].{name}", value, problems)
        if len(problems) > 20:
            break
    for name in names:
        if not PARAM_NAME.fullmatch(name):
            problems.append(
                FieldProblem(f"points[0].{name}", "a parameter name must be an identifier")
            )
    _check_name_collisions("points[0]", names, problems)
    return names


def _check_name_collisions(field: str, names: list[str], problems: list[FieldProblem]) -> None:
    seen: dict[str, str] = {}
    for name in names:
        env = param_env_name(name)
        if env in seen:
            problems.append(
                FieldProblem(field, f"parameters {seen[env]} and {name} both map to {env}")
            )
        seen[env] = name


def _placeholders(command: str) -> list[tuple[str, str, str | None]]:
    """(field name, format spec, conversion) of every placeholder in the template."""
    return [
        (name, spec or "", conversion)
        for _, name, spec, conversion in string.Formatter().parse(command)
        if name is not None
    ]


def _check_command(command: str, names: list[str], problems: list[FieldProblem]) -> None:
    try:
        fields = _placeholders(command)
    except ValueError as exc:
        problems.append(
            FieldProblem(
                "command", f"bad placeholder syntax ({exc}); write {{{{ and }}}} for literal braces"
            )
        )
        return
    for name, spec, conversion in fields:
        if conversion is not None or "{" in spec:
            problems.append(
                FieldProblem(
                    "command", f"placeholder {{{name}}} may not use !conversions or nested fields"
                )
            )
        elif any(int(n) > MAX_FORMAT_WIDTH for n in re.findall(r"[0-9]+", spec)):
            problems.append(
                FieldProblem(
                    "command",
                    f"placeholder {{{name}:{spec}}}: widths and precisions are at most "
                    f"{MAX_FORMAT_WIDTH}",
                )
            )
        elif name not in names:
            known = ", ".join(names) if names else "none"
            hint = ""
            if f"${{{name}" in command:
                hint = f"; for the shell's ${{{name}}} write ${{{{{name}}}}}"
            problems.append(
                FieldProblem(
                    "command",
                    f"placeholder {{{name}}} is not a parameter (parameters: {known}){hint}",
                )
            )


def _values_by_name(spec: BagSpec, axes: dict[str, list] | None) -> dict[str, list]:
    """Every value each parameter takes."""
    if axes is not None:
        return axes
    values: dict[str, list] = {}
    for point in spec.points or ():
        for name, value in point.items():
            values.setdefault(name, []).append(value)
    return values


def _check_sizes(spec: BagSpec, axes: dict[str, list] | None, problems: list[FieldProblem]) -> None:
    """The largest job's command and environment must fit what Linux lets a process
    start with (controller/bags/job_command.py)."""
    values_field = "parameters" if axes is not None else "points"
    problem = size_problem(spec.command, spec.env, _values_by_name(spec, axes), values_field)
    if problem is not None:
        problems.append(FieldProblem(*problem))


def _check_env(spec: BagSpec, names: list[str], problems: list[FieldProblem]) -> None:
    for key, value in spec.env.items():
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            problems.append(
                FieldProblem(
                    f"env.{key}", f"is {len(value):,} characters; at most {MAX_VALUE_CHARS:,}"
                )
            )
        if not ENV_NAME.fullmatch(key):
            problems.append(FieldProblem(f"env.{key}", "not a valid environment variable name"))
        elif key.startswith("SPOTBAG_"):
            problems.append(FieldProblem(f"env.{key}", "SPOTBAG_* variables are set by spotbag"))


def _check_runtime_param(
    spec: BagSpec,
    names: list[str],
    axes: dict[str, list] | None,
    problems: list[FieldProblem],
) -> None:
    """`estimated_runtime_param` names a parameter whose every value is a runtime in
    seconds: a number from MIN_RUNTIME_S to max_runtime_s."""
    name = spec.estimated_runtime_param
    if not isinstance(name, str):
        return
    if name not in names:
        known = ", ".join(names) if names else "none"
        problems.append(
            FieldProblem(
                "estimated_runtime_param", f"{name!r} is not a parameter (they are: {known})"
            )
        )
        return
    if axes is not None:
        values = [(f"parameters.{name}", v) for v in axes[name]]
    elif isinstance(spec.points, list):
        values = [(f"points[{i}].{name}", p.get(name)) for i, p in enumerate(spec.points)]
    else:
        return
    top = spec.max_runtime_s if isinstance(spec.max_runtime_s, (int, float)) else MAX_RUNTIME_S
    for field, value in values:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not MIN_RUNTIME_S <= value <= top:
            problems.append(
                FieldProblem(
                    field,
                    f"is {value!r}: estimated_runtime_param needs a runtime in seconds, "
                    f"{MIN_RUNTIME_S:g} to max_runtime_s ({top:g})",
                )
            )
            return


def _check_limits(spec: BagSpec, problems: list[FieldProblem]) -> None:
    if spec.on_demand == "when_needed" and spec.deadline is None:
        problems.append(
            FieldProblem("on_demand", "when_needed needs a deadline (to know when they are needed)")
        )
    if spec.estimated_runtime_s is not None and spec.estimated_runtime_s > spec.max_runtime_s:
        problems.append(
            FieldProblem(
                "estimated_runtime_s",
                f"{spec.estimated_runtime_s} exceeds max_runtime_s {spec.max_runtime_s}",
            )
        )


def _has_format_specs(command: str) -> bool:
    return any(spec for _, spec, _ in _placeholders(command))


def _check_rendering(bag: Bag) -> None:
    """Every job's command formats. A format spec can fail on a value: `{x:d}` on a
    string, and on a number too large for it (`{x:.2f}` on 10**400: OverflowError)."""
    for i, point in enumerate(bag.points()):
        try:
            render_command(bag.spec.command, point)
        except (ValueError, TypeError, OverflowError) as exc:
            shown = reprlib.repr(point)  # a 400-digit value is not worth quoting whole
            raise BagSpecError.one("command", f"cannot format job {i} ({shown}): {exc}") from None
