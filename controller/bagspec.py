"""Bag specs (SPEC.md §1): validation, expansion into jobs, and each job's command and environment.

A bag is one command template run over a parameter space:

- `parameters`: named axes, each a list of values or `{"range": [start, stop, step]}`
  (stop excluded, as in Python's range); the jobs are their cartesian product,
  in declaration order with the last axis varying fastest;
- or `points`: an explicit list of `{name: value}` objects, all with the same names;
- neither: a bag of one job.

`{name}` placeholders in the command are filled per job, shell-quoted (an
optional format spec such as `{r:.3f}` is applied first); every value is also
exported as `SPOTBAG_PARAM_<NAME>`. Errors name the field they are about
(`parameters.r`, `resources.cpus`, ...).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import shlex
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ACCOUNT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_RUNTIME_S = 30 * 86_400.0

ParamValue = bool | int | float | str


@dataclass(frozen=True)
class FieldProblem:
    field: str  # dotted path into the spec, e.g. "parameters.r" or "resources.cpus"
    message: str


class BagSpecError(ValueError):
    """A bag spec that cannot be accepted; `problems` lists every field at fault."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{first.field}: {first.message}{more}")

    @classmethod
    def one(cls, field: str, message: str) -> BagSpecError:
        return cls([FieldProblem(field, message)])


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Resources(_Strict):
    cpus: int = Field(1, ge=1, le=4096, description="vCPUs each job needs.")
    gpus: int = Field(0, ge=0, le=64, description="GPUs each job needs.")
    memory_gb: float = Field(1.0, gt=0, le=65536, description="Memory each job needs, in GB.")
    vm_types: list[str] | None = Field(
        None, min_length=1, description="Only these VM types may run the jobs."
    )
    regions: list[str] | None = Field(
        None, min_length=1, description="Only VMs in these zones/regions may run the jobs."
    )


class SimulationHints(_Strict):
    """How `spotbag simulate` should pretend each job behaves."""

    runtime_s: float | None = Field(
        None, gt=0, description="Runtime of each job (default: estimated_runtime_s)."
    )
    runtime_cv: float = Field(
        0.0, ge=0, le=10, description="Coefficient of variation of a lognormal runtime."
    )
    failure_probability: float = Field(
        0.0, ge=0, le=1, description="Chance that an attempt exits non-zero."
    )
    failure_exit_code: int = Field(1, ge=1, le=255, description="Exit code of a failing attempt.")


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
        gt=0, le=MAX_RUNTIME_S, description="Longest an attempt may run; what the ledger reserves."
    )
    estimated_runtime_s: float | None = Field(
        None, gt=0, le=MAX_RUNTIME_S, description="Expected runtime of a job, if known."
    )
    checkpointable: bool = Field(False, description="Jobs can checkpoint and resume.")
    max_attempts: int = Field(
        5, ge=1, le=100, description="Attempts per job, preemptions included."
    )
    retryable_exit_codes: list[int] = Field(
        default_factory=list, description="Non-zero exit codes that mean 'try again'."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    workdir: str | None = Field(
        None,
        description="Working directory of each job (local executor); the CLI fills in its own.",
    )
    simulation: SimulationHints | None = None


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
    try:
        spec = BagSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(err) for err in exc.errors()]
        # Report the other fields' problems too, as far as the raw values allow.
        bad_fields = {p.field.split(".")[0].split("[")[0] for p in problems}
        try:
            raw = BagSpec.model_construct(**{k: v for k, v in data.items() if k not in bad_fields})
            _check_semantics(raw, problems)
        except Exception:  # the raw values are too broken to say more
            pass
        raise BagSpecError(problems) from None
    problems = []
    axes = _check_semantics(spec, problems)
    if problems:
        raise BagSpecError(problems)
    if axes is not None:
        count = math.prod(len(values) for values in axes.values())
    elif spec.points is not None:
        count = len(spec.points)
    else:
        count = 1
    if count > max_jobs:
        raise BagSpecError.one(
            "parameters" if axes is not None else "points",
            f"the bag has {count:,} jobs; at most {max_jobs:,} are allowed per bag "
            "(split it into several bags)",
        )
    bag = Bag(spec=spec, axes=axes, job_count=count)
    if _has_format_specs(spec.command):
        _check_rendering(bag)
    return bag


def _check_semantics(spec: BagSpec, problems: list[FieldProblem]) -> dict[str, list] | None:
    """The checks a schema cannot express; returns the resolved parameter axes."""
    axes = _check_parameters(spec, problems)
    names = list(axes) if axes is not None else _point_names(spec, problems)
    if isinstance(spec.command, str):
        _check_command(spec.command, names, problems)
    _check_env(spec, names, problems)
    _check_limits(spec, problems)
    return axes


def _problem(err: Mapping[str, Any]) -> FieldProblem:
    loc = ".".join(str(part) for part in err["loc"]) or "(body)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "missing":
        message = "required field is missing"
    return FieldProblem(loc, message)


def _check_value(field: str, value: Any, problems: list[FieldProblem]) -> None:
    if not isinstance(value, ParamValue) or (isinstance(value, float) and not math.isfinite(value)):
        problems.append(
            FieldProblem(field, f"values must be strings, numbers or booleans, got {value!r}")
        )


def _check_parameters(spec: BagSpec, problems: list[FieldProblem]) -> dict[str, list] | None:
    if spec.parameters is not None and spec.points is not None:
        problems.append(FieldProblem("points", "give either parameters or points, not both"))
        return None
    if spec.parameters is None:
        return None
    if not spec.parameters:
        problems.append(FieldProblem("parameters", "must name at least one parameter"))
        return None
    axes: dict[str, list] = {}
    for name, axis in spec.parameters.items():
        field = f"parameters.{name}"
        if not PARAM_NAME.match(name):
            problems.append(
                FieldProblem(
                    field, "a parameter name must be an identifier ([A-Za-z_][A-Za-z0-9_]*)"
                )
            )
            continue
        if isinstance(axis, Mapping):
            values = _expand_range(field, axis, problems)
        elif isinstance(axis, list):
            values = axis
            for i, value in enumerate(values):
                _check_value(f"{field}[{i}]", value, problems)
        else:
            problems.append(
                FieldProblem(field, 'must be a list of values or {"range": [start, stop, step]}')
            )
            continue
        if values is not None and not values:
            problems.append(FieldProblem(field, "has no values"))
        axes[name] = values or []
    _check_name_collisions("parameters", list(axes), problems)
    return axes


def _expand_range(field: str, axis: Mapping[str, Any], problems: list[FieldProblem]) -> list | None:
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
        isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) for b in bounds
    ):
        problems.append(
            FieldProblem(f"{field}.range", "start, stop and step must be finite numbers")
        )
        return None
    start, stop, step = (*bounds, 1) if len(bounds) == 2 else bounds
    if step == 0:
        problems.append(FieldProblem(f"{field}.range", "step must not be 0"))
        return None
    count = max(0, math.ceil((stop - start) / step - 1e-9))
    if count > 10_000_000:
        problems.append(FieldProblem(f"{field}.range", f"has {count:,} values; at most 10,000,000"))
        return None
    if all(isinstance(b, int) for b in (start, stop, step)):
        return list(range(start, stop, step))
    # Round to the inputs' decimals so that 0.1 steps give 0.3, not 0.30000000000000004.
    decimals = max(-Decimal(repr(float(x))).as_tuple().exponent for x in (start, step))
    return [round(start + k * step, decimals) for k in range(count)]


def _point_names(spec: BagSpec, problems: list[FieldProblem]) -> list[str]:
    if spec.points is None:
        return []
    if not spec.points:
        problems.append(FieldProblem("points", "must list at least one point"))
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
        if not PARAM_NAME.match(name):
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


def _check_env(spec: BagSpec, names: list[str], problems: list[FieldProblem]) -> None:
    for key in spec.env:
        if not ENV_NAME.match(key):
            problems.append(FieldProblem(f"env.{key}", "not a valid environment variable name"))
        elif key.startswith("SPOTBAG_"):
            problems.append(FieldProblem(f"env.{key}", "SPOTBAG_* variables are set by spotbag"))


def _check_limits(spec: BagSpec, problems: list[FieldProblem]) -> None:
    if spec.estimated_runtime_s is not None and spec.estimated_runtime_s > spec.max_runtime_s:
        problems.append(
            FieldProblem(
                "estimated_runtime_s",
                f"{spec.estimated_runtime_s} exceeds max_runtime_s {spec.max_runtime_s}",
            )
        )
    for i, code in enumerate(spec.retryable_exit_codes):
        if not 1 <= code <= 255:
            problems.append(FieldProblem(f"retryable_exit_codes[{i}]", "exit codes are 1..255"))


def _has_format_specs(command: str) -> bool:
    return any(spec for _, spec, _ in _placeholders(command))


def _check_rendering(bag: Bag) -> None:
    for i, point in enumerate(bag.points()):
        try:
            render_command(bag.spec.command, point)
        except (ValueError, TypeError) as exc:
            raise BagSpecError.one("command", f"cannot format job {i} ({point}): {exc}") from None


# --- per-job command and environment -----------------------------------------


def param_env_name(name: str) -> str:
    return f"SPOTBAG_PARAM_{name.upper()}"


def param_text(value: ParamValue) -> str:
    """How a value is written into commands and the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@functools.lru_cache(maxsize=256)
def _parsed(template: str) -> tuple[tuple[str, str | None, str | None], ...]:
    return tuple((lit, name, spec) for lit, name, spec, _ in string.Formatter().parse(template))


def render_command(template: str, params: Mapping[str, ParamValue]) -> str:
    """Fill `{name}` / `{name:spec}` placeholders with shell-quoted values."""
    out = []
    for literal, name, spec in _parsed(template):
        out.append(literal)
        if name is not None:
            value = params[name]
            text = format(value, spec) if spec else param_text(value)
            out.append(shlex.quote(text))
    return "".join(out)


def job_environment(
    *,
    bag_id: str,
    job_id: str,
    attempt: int,
    checkpoint_dir: str,
    params: Mapping[str, ParamValue],
    extra: Mapping[str, str],
) -> dict[str, str]:
    env = dict(extra)
    env.update(
        SPOTBAG_BAG_ID=bag_id,
        SPOTBAG_JOB_ID=job_id,
        SPOTBAG_ATTEMPT=str(attempt),
        SPOTBAG_CHECKPOINT_DIR=checkpoint_dir,
    )
    for name, value in params.items():
        env[param_env_name(name)] = param_text(value)
    return env
