"""Callbacks from slurmctld's hooks (slurm_hooks/spotbag_hook.py): their signature,
their shape and the key that makes each one count once.

Signature: X-Spotbag-Timestamp (epoch seconds) and X-Spotbag-Signature
`sha256=HMAC-SHA256(secret, timestamp + "." + body)`, the secret shared with the
hooks only (not an API token). A timestamp further than the window from now is
refused, so a captured request cannot be replayed later; within the window a replay
is recognised by its key and changes nothing.

Keys (SLURM.md): job name:job id:restart count:event for the prolog and epilog,
job name:job id:submit:end:jobcomp for jobcomp (a job's end happens once, even
after a requeue with the same id), and event:nodes:event id for power-saving events
(each hook run is its own event).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.errors import SpotbagError

SIGNATURE_HEADER = "X-Spotbag-Signature"
TIMESTAMP_HEADER = "X-Spotbag-Timestamp"
JOB_EVENTS = ("jobcomp", "prolog_slurmctld", "epilog_slurmctld")
POWER_EVENTS = ("resume", "suspend", "resume_fail")
# A pool job's start waits this long at most for its verdict, its end for being written
# (controller/slurm/events.py): the hook's answer, or 503 for an end not written yet.
POOL_VERDICT_WAIT_S = 3.0


class CallbackRejected(SpotbagError):
    """A callback whose signature or timestamp does not hold (HTTP 401)."""

    status = 401
    code = "unauthorized"


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    return (
        "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    )


def verify(
    secret: bytes,
    timestamp: str | None,
    signed: str | None,
    body: bytes,
    now: float,
    window_s: float,
) -> None:
    """Raise CallbackRejected unless `signed` is the body's signature at `timestamp`
    and `timestamp` is within `window_s` of `now`."""
    if not timestamp or not signed:
        raise CallbackRejected(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > 12:
        raise CallbackRejected(f"{TIMESTAMP_HEADER} is not epoch seconds")
    if abs(now - int(timestamp)) > window_s:
        raise CallbackRejected(
            f"{TIMESTAMP_HEADER} is {abs(now - int(timestamp)):.0f} s from now "
            f"(the window is {window_s:g} s): a replay, or the clocks disagree"
        )
    # compare_digest takes ASCII strings only (a header of raw bytes is not).
    if not signed.isascii() or not hmac.compare_digest(signature(secret, timestamp, body), signed):
        raise CallbackRejected("bad signature (is the hooks' secret the controller's?)")


# Epoch seconds a hook may report: from 1970 to the year 5138. Bounded so that the
# event's key (int(submit)) and the store's REAL and INTEGER columns take them.
MAX_EPOCH_S = 1e11
MAX_CPUS = 10_000_000  # a Slurm job's CPUs (PROCS), over all its nodes
MAX_RESTARTS = 2**31 - 1  # Slurm keeps a job's restart count in 16 bits; a SQLite int


def _epoch() -> Any:
    return Field(None, ge=0, le=MAX_EPOCH_S)


class SlurmEvent(BaseModel):
    """One hook run's report (the fields each hook knows; the others stay empty).
    Numbers are finite and bounded: an infinite `submit` made the key's int() raise."""

    model_config = ConfigDict(extra="ignore", str_max_length=100_000, allow_inf_nan=False)

    event: Literal[
        "jobcomp", "prolog_slurmctld", "epilog_slurmctld", "resume", "suspend", "resume_fail"
    ]
    event_id: str = Field("", max_length=64)
    sent_at: float | None = _epoch()
    cluster: str = ""
    job_id: str = Field("", max_length=32, pattern=r"^[0-9]*$")
    job_name: str = ""
    restart_count: int = Field(0, ge=0, le=MAX_RESTARTS)
    state: str = ""
    exit_code: str = ""
    nodes: str = ""
    partition: str = ""
    user: str = ""
    account: str = ""
    cpus: float | None = Field(None, ge=0, le=MAX_CPUS)
    submit: float | None = _epoch()
    start: float | None = _epoch()
    end: float | None = _epoch()
    resume: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        if self.event == "jobcomp":
            return f"{self.job_name}:{self.job_id}:{_int(self.submit)}:{_int(self.end)}:jobcomp"
        if self.event in JOB_EVENTS:
            return f"{self.job_name}:{self.job_id}:{self.restart_count}:{self.event}"
        return f"{self.event}:{self.nodes}:{self.event_id}"

    @property
    def about_a_job(self) -> bool:
        return self.event in JOB_EVENTS


def _int(value: float | None) -> str:
    return "" if value is None else str(int(value))
