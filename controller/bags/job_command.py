"""One job's command and environment: its bag's command template filled with the
job's parameter values (shell-quoted), and the SPOTBAG_* variables it runs with.

Also how large they can get without starting a job: Linux refuses an exec (E2BIG)
whose arguments and environment pass ARG_MAX, so a bag whose largest job would is
refused at admission (controller/bags/spec.py reports it with the field at fault).
"""

from __future__ import annotations

import functools
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass

ParamValue = bool | int | float | str

# One job's command goes to /bin/sh -c as a single argument, and each value into the
# environment: Linux refuses any single one above 128 KiB (MAX_ARG_STRLEN).
MAX_COMMAND_CHARS = 100_000
# All of them together must also fit: Linux refuses an exec (E2BIG) whose arguments and
# environment pass ARG_MAX (a quarter of the stack limit, 2 MiB by default, at least
# 128 KiB). A job's own part, its command and the environment spotbag adds (env, the
# SPOTBAG_PARAM_* values, the SPOTBAG_* ids), is held to 128 KiB in UTF-8 bytes, which
# leaves the rest of ARG_MAX to the environment the daemon passes on.
MAX_EXEC_BYTES = 128 * 1024
# The SPOTBAG_* ids and the checkpoint directory, counted generously.
_SPOTBAG_VARS_BYTES = 4096


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
def parsed_template(template: str) -> tuple[tuple[str, str | None, str | None], ...]:
    """(literal text, field name, format spec) of each part of a command template."""
    return tuple((lit, name, spec) for lit, name, spec, _ in string.Formatter().parse(template))


def render_command(template: str, params: Mapping[str, ParamValue]) -> str:
    """Fill `{name}` / `{name:spec}` placeholders with shell-quoted values."""
    out = []
    for literal, name, spec in parsed_template(template):
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


# --- how large a job's command and environment can get ------------------------------------


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _longest_utf8(texts: list[str]) -> int:
    if "".join(texts).isascii():  # the usual case, without encoding each one
        return max(map(len, texts), default=0)
    return max(len(text.encode("utf-8", "surrogatepass")) for text in texts)


@dataclass(frozen=True)
class _JobSizes:
    """The largest job's sizes, from each parameter's longest value (no need to render
    every job): an upper bound on any one job's."""

    command_chars: int
    command_bytes: int
    param_bytes: int  # the SPOTBAG_PARAM_* variables, each with its NUL and pointer


def _job_sizes(command: str, values: dict[str, list]) -> _JobSizes:
    """ValueError/TypeError/OverflowError when a format spec does not suit a value
    (`{x:.2f}` of 10**400 overflows a float)."""
    parsed = parsed_template(command)
    used = {(name, fmt or "") for _, name, fmt in parsed if name is not None and name in values}
    shown: dict[tuple[str, str], tuple[int, int]] = {}  # placeholder -> (chars, bytes)
    param_bytes = 0
    for name, taken in values.items():
        if not taken:
            continue
        texts = [param_text(value) for value in taken]
        param_bytes += len(param_env_name(name)) + 1 + _longest_utf8(texts) + 1 + 8
        for used_name, fmt in used:
            if used_name == name:
                rendered = [format(value, fmt) for value in taken] if fmt else texts
                quoted = [shlex.quote(text) for text in rendered]
                shown[name, fmt] = (max(map(len, quoted)), _longest_utf8(quoted))
    command_chars = command_bytes = 0
    for literal, placeholder, spec in parsed:
        command_chars += len(literal)
        command_bytes += _utf8_len(literal)
        if placeholder is not None and placeholder in values:
            chars, size = shown.get((placeholder, spec or ""), (0, 0))
            command_chars += chars
            command_bytes += size
    return _JobSizes(command_chars, command_bytes, param_bytes)


def size_problem(
    command: str, env: Mapping[str, str], values: dict[str, list], values_field: str
) -> tuple[str, str] | None:
    """(field, message) when the longest command any job can get passes
    MAX_COMMAND_CHARS, or its command and the environment spotbag gives it, in the
    bytes an exec counts (each string, its NUL and its pointer), pass MAX_EXEC_BYTES:
    past ARG_MAX every attempt would fail to start (E2BIG). `values`: every value each
    parameter takes, given in `values_field` (parameters or points). None when a
    format spec does not suit a value (the caller reports that when it renders)."""
    try:
        sizes = _job_sizes(command, values)
    except (ValueError, TypeError, OverflowError):
        return None
    if sizes.command_chars > MAX_COMMAND_CHARS:
        return (
            "command",
            f"a job's command would be {sizes.command_chars:,} characters long; "
            f"at most {MAX_COMMAND_CHARS:,} (pass large values through files)",
        )
    # /bin/sh -c COMMAND: three strings, each with its NUL and its pointer.
    command_bytes = sizes.command_bytes + len("/bin/sh-c") + 3 * (1 + 8)
    env_bytes = sum(_utf8_len(key) + _utf8_len(value) + 2 + 8 for key, value in env.items())
    params = sizes.param_bytes
    total = command_bytes + env_bytes + params + _SPOTBAG_VARS_BYTES
    if total <= MAX_EXEC_BYTES:
        return None
    parts = {"command": command_bytes, "env": env_bytes, values_field: params}
    largest = max(parts, key=parts.__getitem__)
    return (
        largest,
        f"a job's command and environment would take {total:,} bytes (command "
        f"{command_bytes:,}, env {env_bytes:,}, parameter values {params:,}, spotbag's own "
        f"{_SPOTBAG_VARS_BYTES:,}); at most {MAX_EXEC_BYTES:,} (128 KiB) fit in what Linux "
        "lets a process start with (pass large values through files)",
    )
