"""Slurm's command-line tools, run off the event loop, each with a timeout.

Every call is an asyncio subprocess (the loop never waits on it) with a scrubbed
environment: PATH, SLURM_CONF and a UTF-8 locale. Nothing of the daemon's own
environment reaches Slurm: sbatch's default `--export=ALL` would otherwise hand
the daemon's variables (its API token, cloud credentials) to every job.

Failures are typed so the caller can tell "try again later" from "no":

- `SlurmUnavailable`: the controller did not answer (timeout, connection refused,
  a tool that is not installed): nothing was decided, retry later;
- `SlurmRefused`: Slurm answered and said no (unknown node, bad option); the
  message is Slurm's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.errors import SpotbagError

# What Slurm's clients print when they cannot reach slurmctld (22.05's messages):
# the request may not have been seen at all, so the answer is "unknown", not "no".
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted"
    r"|Connection refused|Communication connection failure|Slurm backup controller in standby"
    r"|Could not establish a configuration source|is DOWN",
    re.IGNORECASE,
)


# Failures before the request left this host: it certainly did not take effect.
_NOT_SENT = re.compile(
    r"connect failure|Connection refused|Could not establish a configuration source",
    re.IGNORECASE,
)


class SlurmError(SpotbagError):
    """A Slurm command failed; `command` names it."""

    status = 503
    code = "slurm_unavailable"

    def __init__(self, message: str, command: str = "", *, maybe_done: bool = False) -> None:
        super().__init__(message)
        self.command = command
        self.maybe_done = maybe_done


class SlurmUnavailable(SlurmError):
    """Slurm did not answer: try again later. `maybe_done`: the request may have reached
    slurmctld and taken effect (a timeout), so look before doing it again."""


class SlurmRefused(SlurmError):
    """Slurm answered no; the message is Slurm's."""


@dataclass(frozen=True)
class SlurmTools:
    """Where Slurm's tools are and how to call them.

    `slurm_conf` is the cluster's slurm.conf ("" leaves SLURM_CONF unset, so the tools
    use their compiled-in default or configless lookup); `bin_dir` holds sbatch,
    squeue, ... ("" finds them on the daemon's PATH)."""

    slurm_conf: str = ""
    bin_dir: str = ""
    timeout_s: float = 30.0

    def environment(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def path_of(self, tool: str) -> str:
        return os.path.join(self.bin_dir, tool) if self.bin_dir else tool

    async def run(
        self,
        tool: str,
        *args: str,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run `tool args...`; its stdout on success. Raises SlurmUnavailable or
        SlurmRefused (see the module docstring)."""
        command = " ".join([tool, *args[:3]]) + (" ..." if len(args) > 3 else "")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            process = await asyncio.create_subprocess_exec(
                self.path_of(tool),
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env) if env is not None else self.environment(),
                start_new_session=True,  # on a timeout, its whole group is killed
            )
        except FileNotFoundError:
            where = f" in {self.bin_dir}" if self.bin_dir else " on PATH"
            raise SlurmUnavailable(
                f"{tool} not found{where}: is Slurm installed?", command
            ) from None
        except OSError as exc:
            raise SlurmUnavailable(f"cannot run {tool}: {exc}", command) from None
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await process.wait()
            raise SlurmUnavailable(
                f"{command}: no answer within {limit:g} s", command, maybe_done=True
            ) from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            # Reaped before the cancellation goes on: a process left to the garbage
            # collector closes its pipes on an event loop that may be closed by then.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 2.0)
            raise
        if process.returncode != 0:
            message = (err or out).decode("utf-8", "replace").strip() or (
                f"exit status {process.returncode}"
            )
            if _UNREACHABLE.search(message):
                raise SlurmUnavailable(
                    f"{command}: {message}", command, maybe_done=not _NOT_SENT.search(message)
                )
            raise SlurmRefused(f"{command}: {message}", command)
        return out.decode("utf-8", "replace")


# --- parsing -------------------------------------------------------------------------


def split_rows(text: str, fields: int) -> list[list[str]]:
    """Rows of `|`-separated output with `fields` columns; the last column keeps any
    further `|` (put free text such as job names last)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", fields - 1)
        if len(parts) == fields:
            rows.append(parts)
    return rows


def key_values(line: str) -> dict[str, str]:
    """`scontrol -o show ...` output (one record per line, Key=Value separated by
    spaces; values may contain spaces only in the last fields, e.g. Reason)."""
    found: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        name, sep, value = token.partition("=")
        if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", name):
            key = name
            found[key] = value
        elif key is not None and token:
            found[key] += " " + token
    return found


def exit_status(text: str) -> tuple[int, int]:
    """Slurm's "code:signal" (ExitCode=4:0, EXITCODE=0:9) as (code, signal)."""
    code, _, sig = text.strip().partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 0, 0


def slurm_time(text: str) -> float | None:
    """Epoch seconds of squeue's %S/%e time ("2026-11-25T08:05:14"), None for
    "N/A", "Unknown" or "None"."""
    import datetime as dt

    text = text.strip()
    if not text or text in ("N/A", "Unknown", "None", "0"):
        return None
    if text.isdigit():
        return float(text)
    try:
        # squeue prints local time without a zone.
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class HostlistError(SpotbagError):
    """A hostlist that is malformed, or names more nodes than the caller allows; from a
    callback, a 400 (the hook does not send it again)."""

    status = 400
    code = "invalid_hostlist"


# A range bound this long is no node number (and Python refuses to parse ints of more
# than 4,300 digits anyway).
_MAX_DIGITS = 18


def _groups(expression: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    """Each top-level part as (prefix, [(low, high)], suffix); a plain name is
    (name, [], ""). Checked, not expanded."""
    groups: list[tuple[str, list[tuple[str, str]], str]] = []
    for part in _split_top_level(expression):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                raise HostlistError(f"hostlist: cannot read {part[:80]!r}")
            groups.append((part, [], ""))
            continue
        prefix, ranges, suffix = match.groups()
        bounds = []
        for item in ranges.split(","):
            low, sep, high = item.strip().partition("-")
            high = high if sep else low
            if not (low.isdigit() and high.isdigit()) or max(len(low), len(high)) > _MAX_DIGITS:
                raise HostlistError(f"hostlist: {item[:40]!r} in {part[:80]!r} is not a range")
            if int(high) < int(low):
                raise HostlistError(f"hostlist: {item!r} in {part[:80]!r} runs backwards")
            bounds.append((low, high))
        groups.append((prefix, bounds, suffix))
    return groups


def hostlist_count(expression: str) -> int:
    """How many names a Slurm hostlist holds, counted from its ranges: nothing is
    expanded, so "spot-[0-99999999]" costs what its 17 characters do."""
    return sum(
        sum(int(high) - int(low) + 1 for low, high in bounds) if bounds else 1
        for _, bounds, _ in _groups(expression)
    )


def hostlist_expand(expression: str, limit: int | None = None) -> list[str]:
    """Node names of a Slurm hostlist ("spot-[0-2,7],gpu1" -> spot-0 spot-1 spot-2
    spot-7 gpu1), zero padding kept ("n[01-03]" -> n01 n02 n03). One bracket group
    per name, as slurm.conf node names use.

    `limit`: refuse (HostlistError) a list of more names, counted before any is made.
    A hostlist from a callback must have one: "spot-[0-99999999]" is 17 characters,
    and expanding it would hold the event loop for minutes and take gigabytes."""
    groups = _groups(expression)
    if limit is not None:
        count = hostlist_count(expression)
        if count > limit:
            raise HostlistError(
                f"hostlist {expression[:80]!r} names {count} nodes, more than the {limit} allowed"
            )
    names: list[str] = []
    for prefix, bounds, suffix in groups:
        if not bounds:
            names.append(prefix)
            continue
        for low, high in bounds:
            width = len(low) if low.startswith("0") else 0
            for n in range(int(low), int(high) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return names


def _split_top_level(expression: str) -> Sequence[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in expression.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]
