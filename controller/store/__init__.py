"""The store: every SQL statement spotbag runs lives in this package.

- engine.py: connections, the one writer thread and the reader pool, open, close,
  read, write, and the scheduler's write batches (apply, flush, group commit);
- schema.py: the numbered migrations and how they are applied;
- batch.py: the write batch, its rows as named dataclasses, and the SQL that
  writes it;
- rows.py: the shapes of the rows the queries return (TypedDicts);
- one module of queries per domain: bags.py (bags and jobs, and what a restart
  recovers), attempts.py, vms.py, accounts.py (accounts and the ledger),
  tokens.py, callbacks.py, budgets.py (dollar budgets), events.py (events and
  their webhook deliveries), prices.py (price samples and the hopper's migrations),
  preemption_models.py, reports.py, meta.py.

`Store` composes them: each domain's queries are a subclass of `Engine`, so a
query is written as `await self.read(fn)` or `await self.write(fn)` with `fn`
running on a connection of the writer or of a reader.
"""

from __future__ import annotations

from controller.store.accounts import AccountQueries
from controller.store.attempts import AttemptQueries
from controller.store.bags import BagQueries, IdempotencyConflict, job_id_of, split_job_id
from controller.store.batch import SLURM_RUN_COLUMNS, VM_COLUMNS, WriteBatch
from controller.store.budgets import BudgetQueries
from controller.store.callbacks import CallbackQueries
from controller.store.engine import Engine, StoreClosed, StoreUnavailable
from controller.store.events import EventQueries
from controller.store.meta import MetaQueries
from controller.store.preemption_models import ModelQueries
from controller.store.prices import PriceQueries
from controller.store.reports import ReportQueries
from controller.store.schema import MIGRATIONS
from controller.store.tokens import TokenQueries
from controller.store.vms import VmQueries


class Store(
    MetaQueries,
    BagQueries,
    AttemptQueries,
    VmQueries,
    AccountQueries,
    TokenQueries,
    CallbackQueries,
    PriceQueries,
    ModelQueries,
    ReportQueries,
    BudgetQueries,
    EventQueries,
    Engine,
):
    """Async access to the spotbag database at `path` (see Engine for the options)."""


__all__ = [
    "MIGRATIONS",
    "SLURM_RUN_COLUMNS",
    "VM_COLUMNS",
    "IdempotencyConflict",
    "Store",
    "StoreClosed",
    "StoreUnavailable",
    "WriteBatch",
    "job_id_of",
    "split_job_id",
]
