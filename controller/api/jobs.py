"""Jobs and their logs: a bag's jobs page by page, one job with its attempts, and the
output of an attempt (read from the executor's log file, in byte ranges)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.api.base import (
    BAG_PATH,
    ERR,
    JOB_PATH,
    Param,
    Route,
    bag_id_of,
    bounded,
    check_bag_visible,
    controller_of,
    enum_query,
    int_param,
    job_key_of,
    json_response,
    visible_bag,
)
from controller.api.schemas import Job, JobList
from controller.bags.spec import PARAM_NAME
from controller.costs.summary import job_view
from controller.errors import ApiError, NotFound
from controller.scheduler.waiting import waiting_reasons
from controller.states import AttemptState, JobState

JOBS_LIMIT = bounded("limit", "At most this many jobs.", 1, 1000, 100)
JOBS_AFTER = bounded("after", "Only jobs with a larger index (pagination).", -1, 10**12, -1)
LOG_ATTEMPT = bounded("attempt", "Attempt number (default: the latest).", 1, 10**6, None)
LOG_OFFSET = bounded("offset", "Start at this byte (to follow a growing log).", 0, 10**15, 0)
MAX_PARAM_TERMS = 8
MAX_PARAM_VALUE_CHARS = 200
# The longest documented `param` query: 8 terms of a 64-character name, '=' and 200
# characters, each character up to 12 bytes percent-encoded (4 UTF-8 bytes): ~20 KB.
# The daemon's HTTP parser accepts request lines up to MAX_REQUEST_LINE_BYTES (aiohttp's
# default, 8,190, would answer a documented query with a text/plain 400 of its own).
MAX_REQUEST_LINE_BYTES = 64 * 1024
JOBS_PARAM = Param(
    "param",
    "query",
    "Only jobs with this parameter value, as name=value (e.g. seed=3; repeat for several, "
    "all must hold). A number matches equal numbers (3 matches 3.0), true and false match "
    "booleans, and any value matches the same text.",
    {
        "type": "array",
        "maxItems": MAX_PARAM_TERMS,
        "items": {
            "type": "string",
            "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,63}=",
            "maxLength": 64 + 1 + MAX_PARAM_VALUE_CHARS,
        },
    },
)
LOG_LIMIT = bounded("limit", "At most this many bytes (default 1 MiB).", 1, 16 << 20, 1 << 20)


def param_terms(request: web.Request) -> list[tuple[str, list[Any]]]:
    """The `param` filters as (name, the values a job's parameter may have): the text
    itself, and the number or boolean it spells (JSON keeps 3 and "3" apart)."""
    raw = request.query.getall("param", [])
    if len(raw) > MAX_PARAM_TERMS:
        raise ApiError(
            f"query parameter param: at most {MAX_PARAM_TERMS} terms", code="invalid_query"
        )
    terms = []
    for term in raw:
        name, equals, value = term.partition("=")
        if not equals or not PARAM_NAME.fullmatch(name) or len(value) > MAX_PARAM_VALUE_CHARS:
            raise ApiError(
                f"query parameter param: {term[:80]!r} is not name=value (a parameter name, "
                f"'=', at most {MAX_PARAM_VALUE_CHARS} characters of value)",
                code="invalid_query",
            )
        values: list[Any] = [value]
        if value in ("true", "false"):
            values.append(int(value == "true"))  # json_extract gives JSON booleans as 1/0
        else:
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                values.append(number)
        terms.append((name, values))
    return terms


async def list_jobs(request: web.Request) -> web.Response:
    c = controller_of(request)
    bag_id = bag_id_of(request)
    state = enum_query(request, "state", [s.value for s in JobState])
    limit = int_param(request, JOBS_LIMIT)
    after = int_param(request, JOBS_AFTER)
    params = param_terms(request)
    await visible_bag(request, bag_id)
    jobs = await c.store.list_jobs(bag_id, state=state, after_idx=after, limit=limit, params=params)
    retried = [j["idx"] for j in jobs if j["attempts"] > 1]
    preempted = await c.store.preempted_attempts(bag_id, retried) if retried else {}
    views = _with_waiting(c, [job_view(j) for j in jobs], preempted)
    next_after = jobs[-1]["idx"] if len(jobs) == limit else None
    return json_response({"jobs": views, "next_after": next_after})


WAITING = (JobState.QUEUED.value, JobState.HELD.value)


def _with_waiting(
    c: Any, views: list[dict[str, Any]], preempted: dict[int, int]
) -> list[dict[str, Any]]:
    """Jobs' views (of one bag) with why each waits (from the scheduler's state; '' unless
    queued or held) and how many of its attempts a preemption cut short."""
    waiting = [v["index"] for v in views if v["state"] in WAITING]
    scheduler = getattr(c, "scheduler", None)  # None while the daemon starts
    reasons: dict[int, str] = {}
    if waiting and scheduler is not None:
        reasons = waiting_reasons(scheduler, views[0]["bag_id"], waiting, c.clock.now())
    for view in views:
        view["preempted_attempts"] = preempted.get(view["index"], 0)
        view["waiting"] = reasons.get(view["index"], "")
    return views


async def get_job(request: web.Request) -> web.Response:
    c = controller_of(request)
    bag_id, idx = job_key_of(request)
    await check_bag_visible(request, bag_id)
    job = await c.store.get_job(bag_id, idx)
    if job is None:
        raise NotFound(f"job {bag_id}-{idx} does not exist")
    preempted = sum(a["state"] == AttemptState.PREEMPTED for a in job["attempt_list"])
    return json_response(_with_waiting(c, [job_view(job)], {idx: preempted})[0])


async def get_job_log(request: web.Request) -> web.Response:
    c = controller_of(request)
    bag_id, idx = job_key_of(request)
    await check_bag_visible(request, bag_id)
    attempt_number = int_param(request, LOG_ATTEMPT)
    offset = int_param(request, LOG_OFFSET)
    limit = int_param(request, LOG_LIMIT)
    attempt = await c.store.get_attempt(bag_id, idx, attempt_number)
    if attempt is None:
        which = f"attempt {attempt_number}" if attempt_number else "any attempt"
        raise NotFound(f"job {bag_id}-{idx} has no {which} (it may not have started yet)")
    if not attempt["log_path"]:
        raise NotFound(f"the {c.executor.name} executor keeps no log for job {bag_id}-{idx}")
    data, size = await asyncio.to_thread(_read_log, Path(attempt["log_path"]), offset, limit)
    return web.Response(
        body=data,
        content_type="text/plain",
        charset="utf-8",
        headers={
            "X-Spotbag-Attempt": str(attempt["number"]),
            "X-Spotbag-Attempt-State": attempt["state"],
            "X-Spotbag-Log-Size": str(size),
            "X-Spotbag-Next-Offset": str(offset + len(data)),
        },
    )


def _read_log(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(min(offset, size))
            return f.read(limit), size
    except FileNotFoundError:
        return b"", 0


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/v1/bags/{bag_id}/jobs",
        list_jobs,
        "A bag's jobs in index order, optionally by state and parameter values.",
        params=(
            BAG_PATH,
            Param(
                "state", "query", "Only jobs in this state.", {"enum": [s.value for s in JobState]}
            ),
            JOBS_PARAM,
            JOBS_AFTER,
            JOBS_LIMIT,
        ),
        responses={
            200: ("Jobs; next_after is the cursor for the next page.", JobList),
            404: ("No such bag.", ERR),
        },
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}",
        get_job,
        "A job with its attempts, VMs, exit codes and log paths.",
        params=(JOB_PATH,),
        responses={200: ("The job.", Job), 404: ("No such job.", ERR)},
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/log",
        get_job_log,
        "The output of a job's attempt (latest by default).",
        params=(
            JOB_PATH,
            LOG_ATTEMPT,
            LOG_OFFSET,
            LOG_LIMIT,
        ),
        responses={
            200: ("Log text; X-Spotbag-Next-Offset gives the next offset.", None),
            404: ("No such job, attempt or log.", ERR),
        },
    ),
)
