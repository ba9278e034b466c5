"""The API's request and response bodies as pydantic models: /openapi.json is their
JSON schema (openapi.py), and request bodies are validated by them.

Request models (AccountCreate, Credit, TokenCreate) check the small JSON bodies of
the account routes; `parse_body` turns the first problem into the 400 these routes
have always answered (`invalid_body`, a message that starts with the field). A bag's
spec is controller/bags/spec.py's BagSpec, and a Slurm hook's event
controller/slurm/callbacks.py's SlurmEvent.

Response models are documentation only: the handlers build plain dicts (a page of a
thousand jobs is not worth a model per row), and the fuzz test
(tests/integration/test_openapi_fuzz.py) holds every answer to these schemas. A field
is required when every answer has it; one that some answers leave out defaults to
`ABSENT` (no default shown in the schema).
"""

from __future__ import annotations

import reprlib
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.bags.spec import (
    ACCOUNT_NAME,
    MAX_BUDGET_USD,
    MAX_WEBHOOKS,
    MIN_BUDGET_USD,
    BagSpec,
    Webhook,
)
from controller.errors import ApiError
from controller.states import BagState, JobState

ACCOUNT_NAME_PATTERN = ACCOUNT_NAME  # as a bag names it
MAX_CPU_HOURS = 1e15
MAX_NOTE_CHARS = 1000


def _no_default(schema: dict[str, Any]) -> None:
    """Drop the `"default": null` of fields that some answers leave out."""
    for prop in schema.get("properties", {}).values():
        if "default" in prop and prop["default"] is None:
            del prop["default"]


# The default of a field that some answers leave out (missing, not null); the schema
# shows no default for it (_no_default).
ABSENT: Any = None

# --- requests ------------------------------------------------------------------------------


class _Request(BaseModel):
    """A request body: unknown fields are ignored (as they always were); values are
    strictly typed (no "1" for 1, no 1 for true) and numbers finite (1e999 decodes as
    infinity). Patterns use pydantic's default regex engine, whose `$` is the end of the
    text (Python's `re` lets `$` match before a final newline: "lab\n" passed for "lab").
    `messages`: per field, the 400's message, formatted with the value given
    (`{value}`: its repr, shortened), and the `detail.errors` entry's message if any."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
    messages: ClassVar[dict[str, tuple[str, str | None]]] = {}


M = TypeVar("M", bound=_Request)

_NOTE = Field("", max_length=MAX_NOTE_CHARS, description="Free text kept with the entry.")
_NOTE_MESSAGE = (f"must be text of at most {MAX_NOTE_CHARS} characters", None)
_CPU_HOURS_MESSAGE = (
    "must be a number of CPU-hours, 0 or more, not {value}",
    "a non-negative number",
)


_NOTIFY_MESSAGE = (  # formatted with {value}: other braces doubled
    "must be a list of at most " + str(MAX_WEBHOOKS) + " webhooks, each {{url: an http(s) "
    "URL, events: a list of finished, failed, deadline_at_risk, budget_reached, "
    "preemption_storm}}, not {value}",
    "a list of {url, events}",
)

_BUDGET_MESSAGE = (
    "must be a number of US dollars, more than 0 and at most 1e9, or null (no budget), not {value}",
    "a positive number or null",
)


class AccountCreate(_Request):
    # Fields in the order they are checked: the first problem is the one reported.
    name: str = Field(pattern=ACCOUNT_NAME_PATTERN, description="The account's name.")
    unlimited: bool = Field(False, description="No allocation: never runs out of CPU-hours.")
    cpu_hours: float = Field(
        0.0, ge=0, lt=MAX_CPU_HOURS, description="Its first credit, CPU-hours."
    )
    note: str = _NOTE
    budget_usd: float | None = Field(
        None,
        ge=MIN_BUDGET_USD,
        le=MAX_BUDGET_USD,
        description="Most its bags may cost per calendar month (UTC), US dollars; null: no cap.",
    )
    notify: list[Webhook] = Field(
        default_factory=list,
        max_length=MAX_WEBHOOKS,
        description="Webhooks told of every event of the account's bags (docs/notifications.md).",
    )

    messages: ClassVar[dict[str, tuple[str, str | None]]] = {
        "name": ("must be 1-64 letters, digits, '_', '.' or '-', not {value}", None),
        "unlimited": ("must be true or false", None),
        "cpu_hours": _CPU_HOURS_MESSAGE,
        "note": _NOTE_MESSAGE,
        "budget_usd": _BUDGET_MESSAGE,
        "notify": _NOTIFY_MESSAGE,
    }


class BudgetChange(_Request):
    """A new budget for a bag (PATCH /v1/bags/{id}) or an account (PATCH
    /v1/accounts/{account}): US dollars, or null for none."""

    budget_usd: float | None = Field(
        ge=MIN_BUDGET_USD, le=MAX_BUDGET_USD, description="The new cap, US dollars; null: no cap."
    )

    messages: ClassVar[dict[str, tuple[str, str | None]]] = {"budget_usd": _BUDGET_MESSAGE}


class AccountChange(_Request):
    """PATCH /v1/accounts/{account}: its monthly budget, its webhooks, or both (a field
    left out is not changed)."""

    budget_usd: float | None = Field(
        ABSENT,
        ge=MIN_BUDGET_USD,
        le=MAX_BUDGET_USD,
        description="The new monthly cap, US dollars; null: no cap.",
    )
    notify: list[Webhook] = Field(
        ABSENT,
        max_length=MAX_WEBHOOKS,
        description="Its webhooks from now on ([]: none).",
    )

    messages: ClassVar[dict[str, tuple[str, str | None]]] = {
        "budget_usd": _BUDGET_MESSAGE,
        "notify": _NOTIFY_MESSAGE,
    }


class Credit(_Request):
    cpu_hours: float = Field(ge=0, lt=MAX_CPU_HOURS, description="CPU-hours to add.")
    note: str = _NOTE

    messages: ClassVar[dict[str, tuple[str, str | None]]] = {
        "cpu_hours": _CPU_HOURS_MESSAGE,
        "note": _NOTE_MESSAGE,
    }


class TokenCreate(_Request):
    note: str = _NOTE

    messages: ClassVar[dict[str, tuple[str, str | None]]] = {"note": _NOTE_MESSAGE}


def parse_body(model: type[M], data: dict[str, Any]) -> M:
    """`data` (a decoded JSON object) as `model`, or the 400 naming the first field at
    fault, with the value given (None when it is missing)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        message, short = model.messages[name]
        text = f"{name}: {message.format(value=reprlib.repr(data.get(name)))}"
        detail = {"errors": [{"field": name, "message": short}]} if short else None
        raise ApiError(text, code="invalid_body", detail=detail) from None


# --- responses -----------------------------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(json_schema_extra=_no_default)


class ErrorBody(_Response):
    code: str = Field(description="Machine-readable, e.g. invalid_bag.")
    message: str = Field(description="What is wrong; names the field when one is.")
    detail: dict[str, Any] = Field(ABSENT, description="e.g. errors: [{field, message}].")


class Error(_Response):
    error: ErrorBody


class Health(_Response):
    ok: bool
    status: Literal["starting", "ok", "failing"] = Field(
        description="starting: still loading (503, Retry-After; every other route answers 503 "
        "too); ok: ready; failing: running but unable to work (503, problems)."
    )
    driver: str
    schema_version: int = Field(ABSENT, description="Not while starting.")
    problems: list[str] = Field(ABSENT, description="Why it cannot work (503 only).")


class Usage(_Response):
    attempts: int
    interrupted_attempts: int = Field(description="Attempts cut short by a VM preemption.")
    attempt_hours: float
    preempted_attempt_hours: float = Field(
        description="Running time of the attempts a preemption cut short."
    )
    lost_hours: float = Field(
        description="Work those preemptions lost: the time since each one's last checkpoint."
    )
    checkpoints: int = Field(description="Checkpoints the bag's jobs wrote.")
    checkpoint_hours: float = Field(description="Time spent writing them.")
    vm_hours: float = Field(
        description="The bag's share of its VMs' time, split as its cost report splits it "
        "(docs/design.md#cost-reports): its jobs' split VM-hours and its share of the VMs' idle, spare and "
        "unreserved time."
    )
    spot_cost_usd: float = Field(description="What those VM-hours cost (the report's cost).")
    on_demand_cost_usd: float = Field(description="The same VM-hours at on-demand prices.")
    savings_usd: float
    cost_as_of: float = Field(
        description="The instant (epoch seconds) the VM-hours and costs are of: the bag's "
        "report generated then gives the same figures. Running attempts count up to it. "
        "It may lag behind now by a second, or for a large bag (whose split is recomputed "
        "in the background) by up to a minute."
    )
    cost_final: bool = Field(
        description="The bag and every VM its jobs ran on have ended: the cost will not change."
    )


class Pace(_Response):
    """A bag's recent throughput and the ETA of its open jobs at that rate
    (controller/scheduler/waiting.py)."""

    jobs_per_hour: float = Field(description="Jobs ended per hour over its last over_jobs ends.")
    over_jobs: int
    open_jobs: int = Field(description="Jobs not yet finished (waiting or running).")
    eta_s: float = Field(description="Seconds until they are done at that rate.")
    as_of: float


class BagOptions(_Response):
    """The bag's options as the daemon keeps them (defaults filled in)."""

    deadline: str | None = Field(description="As submitted: an instant or a duration.")
    deadline_at: float | None = Field(description="The deadline, epoch seconds.")
    on_demand: Literal["never", "when_needed", "always"]
    deadline_confidence: float
    budget_usd: float | None = Field(description="The cap now (PATCH may have changed it).")
    notify: list[Webhook]


class BagBudget(_Response):
    """Dollars against the bag's and its account's budgets (docs/bags.md#budgets)."""

    budget_usd: float | None
    charged_usd: float = Field(description="What its ended attempts were charged.")
    reserved_usd: float = Field(description="The worst case of its running attempts.")
    account_budget_usd: float | None = Field(ABSENT, description="Its account's monthly cap.")
    account_month_charged_usd: float = Field(ABSENT, description="Its account's month so far.")
    held: str | None = Field(
        description="Why a budget holds it ('held: budget: ...'), or null when none does."
    )


class BagDeadline(_Response):
    """A bag's deadline and the deadline policy's projection (docs/design.md#deadlines);
    the projection's figures are null / empty until the policy has run for the bag (and
    after it ended)."""

    at: float = Field(description="The deadline, epoch seconds.")
    confidence: float = Field(description="The probability with which it should be met.")
    p_meet: float | None = Field(description="Projected probability of meeting it.")
    finish: dict[str, float] = Field(
        description="Projected finish (epoch s) at quantiles: p50, p90, p95."
    )
    at_risk: bool = Field(description="No number of on-demand slots reaches the confidence.")
    on_demand_slots: int = Field(description="Slots the policy runs on on-demand VMs now.")
    on_demand_share: float = Field(
        description="Share of the bag's attempt-hours so far on on-demand VMs (0-1)."
    )


class Bag(_Response):
    id: str
    name: str
    account: str
    state: BagState
    cancel_requested: bool
    created_at: float
    finished_at: float | None
    elapsed_s: float
    job_count: int
    counts: dict[JobState, int] = Field(description="Jobs per state.")
    progress: float = Field(description="Finished jobs / all jobs.")
    usage: Usage
    pace: Pace | None = Field(
        ABSENT,
        description="Recent throughput and ETA (single bags only; null when the bag is not "
        "running or fewer than two of its jobs have ended).",
    )
    spec: BagSpec = Field(ABSENT, description="The spec as submitted (not in lists).")
    options: BagOptions
    budget: BagBudget = Field(
        ABSENT,
        description="Budgets: single bags; in lists, the bags the scheduler runs (to mark "
        "those a budget holds).",
    )
    deadline: BagDeadline | None = Field(
        ABSENT,
        description="Its deadline and projected finish: single bags (null: none); in lists, "
        "the bags the scheduler runs that have one (to mark those at risk).",
    )


class BagList(_Response):
    bags: list[Bag]
    limit: int
    offset: int


class Attempt(_Response):
    number: int = ABSENT
    vm_id: str = ABSENT
    vm_type: str
    state: str = ABSENT
    started_at: float = ABSENT
    ended_at: float | None = ABSENT
    exit_code: int | None = ABSENT
    reason: str = ABSENT
    log_path: str = ABSENT
    ran_at: float | None = Field(
        ABSENT,
        description="When its program began to run; null: it has not (still queued in its "
        "executor), or never did (ended before it ran: charged nothing).",
    )
    executor_ref: str = Field(
        description="The executor's id for it: the Slurm job id (slurm), else empty."
    )


class Checkpoint(_Response):
    attempt: int = ABSENT
    requested_at: float = Field(ABSENT, description="When the job was signalled.")
    at: float = Field(ABSENT, description="When the checkpoint was seen complete.")
    ok: int = Field(ABSENT, description="1: written; 0: not within the time allowed.")
    work_s: float = Field(ABSENT, description="Work saved by it, seconds of runtime.")
    vm_age_h: float = Field(ABSENT, description="VM age when signalled, model hours.")
    detail: str = ABSENT


class Job(_Response):
    id: str
    bag_id: str
    index: int
    params: dict[str, Any]
    state: JobState
    attempts: int
    exit_code: int | None
    reason: str
    vm_id: str | None
    started_at: float | None
    ended_at: float | None
    runtime_s: float | None = Field(
        description="Work it took: its last attempt plus what earlier ones checkpointed."
    )
    work_saved_s: float = Field(
        description="Runtime its last checkpoint holds; a retry resumes there."
    )
    checkpoints: int
    checkpoint_list: list[Checkpoint]
    log_path: str | None
    attempt_list: list[Attempt]
    transitions: list[dict[str, Any]]
    waiting: str = Field(
        "",
        description="Why it waits (queued or held; else empty), from the scheduler's state: "
        "held for credit, backing off, waiting for a VM to boot, for a free slot, ...",
    )
    preempted_attempts: int = Field(0, description="Its attempts a VM preemption cut short.")


class JobList(_Response):
    jobs: list[Job]
    next_after: int | None


class TimelineAttempt(_Response):
    job: str = Field(description="The job's id (<bag id>-<index>).")
    index: int
    number: int = Field(description="1 for its first attempt; more: a retry.")
    vm_id: str
    vm_type: str | None
    state: str = Field(description="starting, running, succeeded, failed, preempted, ...")
    started_at: float
    ended_at: float | None = Field(description="null while it runs.")
    exit_code: int | None
    reason: str


class TimelineCheckpoint(_Response):
    id: int
    job: str
    attempt: int
    requested_at: float = Field(description="When the job was signalled.")
    at: float = Field(description="When the checkpoint was seen complete (or given up on).")
    ok: bool = Field(description="Written; false: not within the time allowed.")
    work_s: float = Field(description="Work saved by it, seconds of runtime.")


class TimelineVm(_Response):
    id: str
    vm_type: str
    zone: str
    spot: bool
    state: str = Field(description="pending, running, terminated, preempted or failed.")
    reason: str
    requested_at: float
    running_at: float | None
    ended_at: float | None = Field(description="When it ended (preempted: when it was lost).")
    notice_until: float | None = Field(
        None, description="A preemption notice: when the cloud takes it (null: none)."
    )


class Timeline(_Response):
    """A bag's attempts over time, per VM (the web UI's Gantt chart)."""

    bag_id: str
    now: float = Field(description="The daemon's clock at the answer: the next `since`.")
    since: int
    truncated: bool = Field(
        description="More attempts were live since `since` than `limit`: the oldest were left out."
    )
    attempts: list[TimelineAttempt] = Field(
        description="Attempts live at or after `since`, oldest start first."
    )
    checkpoints: list[TimelineCheckpoint] = Field(
        description="The checkpoints of those attempts completed from `since` on."
    )
    vms: list[TimelineVm] = Field(description="The VMs those attempts ran on.")


class LearnedModel(_Response):
    key: str = ABSENT
    model: str = ABSENT
    parameters: dict[str, Any] = ABSENT
    n: int = ABSENT
    censored: int = ABSENT
    stats: dict[str, Any] = Field(ABSENT, description="r2, ks, aic, log_likelihood")
    fitted_at: float = ABSENT
    reason: str = ABSENT
    active: int = ABSENT


class ModelCurve(_Response):
    """A preemption model's survival S(t) and hazard h(t) (per hour; null where nothing
    survives) at ages in model hours, for drawing."""

    model: str
    age_h: list[float]
    survival: list[float]
    hazard: list[float | None]


class Models(_Response):
    configured: dict[str, Any]
    learned: list[LearnedModel]
    in_use: list[dict[str, Any]] = Field(
        description="Per live VM: its model, parameters and key, its age (model hours), "
        "survival to that age, expected remaining life (hours; null: unbounded) and whether "
        "the reuse policy counts it stable."
    )
    curves: dict[str, ModelCurve] = Field(description="Per model key in use: its curves.")


class Hopping(_Response):
    configured: dict[str, Any]
    market: list[dict[str, Any]] = Field(
        description="Per VM type: price now, window mean and deviation (USD/h), "
        "on-demand price, normalised price now."
    )
    migrations: list[dict[str, Any]] = Field(
        description="The hopper's moves, newest first, with reason, prices and index."
    )


class TypePrices(_Response):
    vm_type: str
    zone: str
    cpus: int
    memory_gb: float
    size: float = Field(description="sqrt(vCPUs × GB): the unit prices are normalised by.")
    on_demand: float | None = Field(description="USD/h; null when the catalog has none.")
    at: list[float] = Field(description="Sampling times (epoch seconds) with a price.")
    price: list[float] = Field(description="USD/h at those times.")
    normalized: list[float] = Field(description="price / size (USD/h per unit).")


class IndexSeries(_Response):
    at: list[float] = Field(description="Every sampling time (epoch seconds).")
    value: list[float | None] = Field(
        description="The index then (USD/h per unit); null: no type priced."
    )


class PriceHistory(_Response):
    """Recorded spot prices per VM type and the cloud index (policies/index.py)."""

    enabled: bool = Field(description="[hopping] enabled: the hopper samples prices.")
    policy: str
    now: float
    since: int
    truncated: bool = Field(description="More samples than `limit`: the oldest left out.")
    types: list[TypePrices] = Field(description="Every catalog type, in catalog order.")
    index: IndexSeries = Field(
        description="The equal-weight mean of the types' normalised prices, capped ones "
        "left out (docs/design.md#index-tracking)."
    )


class VmList(_Response):
    vms: list[dict[str, Any]] = Field(
        description="The VMs' rows, each with billed_hours (running → ended, or "
        "usage.cost_as_of), cost_usd (what it paid over them, priced as cost reports "
        "price it: a spot VM its type's recorded spot prices while price samples exist, "
        "else its own price) and on_demand_cost_usd (the same hours at its on-demand price), "
        "on_demand (launched on-demand, never preempted; the row's spot is its opposite); "
        "a live VM that got a preemption notice has notice_until, when the provider takes it "
        "(epoch s; null: no notice)."
    )
    usage: dict[str, Any] = Field(
        description="Every VM that ran, so far: total and by_vm_type (vms, vms_preempted, "
        "vm_hours, spot_cost_usd, on_demand_cost_usd), the sums of the VMs' figures, so the "
        "total equals the cost reports of all bags together; cost_as_of: the instant "
        "(epoch s) the figures are of."
    )


class AccountBudget(_Response):
    budget_usd: float | None = Field(description="Monthly cap, US dollars; null: none.")
    month: str = Field(description="The calendar month (UTC) the figures are of, YYYY-MM.")
    month_charged_usd: float
    reserved_usd: float = Field(description="The worst case of its running attempts.")


class Account(_Response):
    account: str
    unlimited: bool
    allocation_cpu_h: float | None = Field(description="null when unlimited.")
    charged_cpu_h: float
    reserved_cpu_h: float
    available_cpu_h: float | None = Field(description="null when unlimited.")
    held_jobs: int = Field(description="Jobs waiting, held, for credit.")
    budget: AccountBudget
    notify: list[Webhook] = Field(description="Its webhooks (docs/notifications.md).")


class AccountList(_Response):
    accounts: list[Account]


class Token(_Response):
    id: str
    account: str
    created_at: float
    revoked_at: float | None
    note: str


class IssuedToken(Token):
    token: str = Field(description="The token itself (sbt_...), shown this once.")


class TokenList(_Response):
    tokens: list[Token]


class RevokedToken(_Response):
    id: str
    account: str
    revoked: Literal[True]


class Preempted(_Response):
    id: str
    preempted: Literal[True]


class Recommended(_Response):
    id: str
    recommended: Literal[True]


class SlurmEventTaken(_Response):
    key: str = Field(description="The event's idempotency key.")
    duplicate: bool
    applied: bool


class EventDelivery(_Response):
    url: str
    state: Literal["pending", "delivered", "failed"]
    attempts: int
    next_try_at: float
    last_status: int | None
    last_error: str
    delivered_at: float | None


class Event(_Response):
    seq: int = Field(description="The order it was recorded in: pass the last as `after`.")
    id: str = Field(description="Unique; sent as X-Spotbag-Event-Id.")
    created_at: float
    kind: Literal["finished", "failed", "deadline_at_risk", "budget_reached", "preemption_storm"]
    bag_id: str | None
    account: str | None
    payload: dict[str, Any]
    deliveries: list[EventDelivery]


class EventList(_Response):
    events: list[Event]
    next_after: int = Field(description="The cursor of the next page (the last seq, or `after`).")
