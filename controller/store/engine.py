"""The engine: connections, the writer thread, the reader pool, and the batch buffer.

SQLite in WAL mode. All writes go through one writer thread fed by a queue, one
transaction per call (the shape of datasette's `Database.execute_write_fn`); reads
run on a small pool of reader threads, each with its own query-only connection, so
the event loop never waits on disk. `threaded=False` runs everything inline on one
connection, which the simulator uses (it has no event loop to protect).

Errors from outside the daemon (full disk, I/O error, read-only or locked file)
come out of `write` as StoreUnavailable, counted in `write_errors` and described in
`write_error` until a write succeeds again. With `group_commit` (simulator only),
scheduler batches are folded together and written before the next read, when they
grow past a bound (the back-pressure), and on close.

The queries themselves live in the domain modules beside this one (bags.py,
accounts.py, ...), each a subclass of Engine that the Store class composes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from controller.errors import SpotbagError
from controller.store.batch import WriteBatch, apply_batch
from controller.store.schema import migrate, restore_missing_indexes

T = TypeVar("T")
log = logging.getLogger("spotbag.store")

# Scheduler batches folded together under group commit are written once they hold
# this many rows, so that memory stays bounded however long no read comes.
GROUP_COMMIT_ROWS = 200_000

# Indexes a bulk writer (`spotbag simulate`) may drop while it writes and build once
# at the end (`Engine.defer_indexes`): each row a run writes then costs its table's
# B-tree alone, and an index is built from its sorted entries in one pass. Each is an
# index the run itself never reads. The bench's 100,000 jobs: 29-31 -> 25.1-26.9 s CPU,
# their build at the end included. Not the unique ledger_once: a reservation charged
# twice still fails at once; nor attempts_live, which the summary reads.
DEFERRABLE_INDEXES = (
    "transitions_by_entity",
    "ledger_by_account",
    "jobs_by_state",
    "attempts_by_vm",
    "vms_by_state",
)


class StoreClosed(SpotbagError, RuntimeError):
    """The store is not open (before open() or after close())."""

    status = 503
    code = "store_closed"


class StoreUnavailable(SpotbagError, RuntimeError):
    """The database cannot be written (or read) now: the disk is full, an I/O error, a
    read-only or locked file. Outside the daemon, and it may pass: retry later."""

    status = 503
    code = "store_unavailable"


# SQLite result codes of conditions outside the daemon (extended codes share the prefix).
_UNAVAILABLE_CODES = (
    "SQLITE_FULL",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_READONLY",
    "SQLITE_NOMEM",
    "SQLITE_PROTOCOL",
)


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return True
    name = getattr(exc, "sqlite_errorname", None) or ""
    return isinstance(exc, sqlite3.Error) and name.startswith(_UNAVAILABLE_CODES)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


class _Writer(threading.Thread):
    """Runs write functions one at a time, each in its own transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(name="spotbag-store-writer", daemon=True)
        self.conn = conn
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            fn, args, future, loop = item
            try:
                result = _in_transaction(self.conn, fn, args)
            except BaseException as exc:  # hand every failure back to the caller
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _in_transaction(conn: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    """fn(conn, *args) in one transaction, committed, or rolled back on any error (a
    failed COMMIT, e.g. on a full disk, too). Errors from outside the daemon are
    raised as StoreUnavailable."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn, *args)
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            # SQLite may have rolled back itself; the original error says why.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        if _is_unavailable(exc):
            raise StoreUnavailable(f"cannot write the database: {exc}") from exc
        raise
    return result


def dict_rows(conn: sqlite3.Connection, sql: str, params: Sequence | dict = ()) -> list[Any]:
    """The rows of a query as dicts keyed by column name. Typed Any: the shape comes
    from the SQL, which a type checker cannot read; each query declares the row shape
    it returns (rows.py)."""
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class Engine:
    """Async access to the spotbag database at `path`: open, close, read, write,
    and the scheduler's write batches (new_batch, apply, flush)."""

    def __init__(
        self,
        path: str | Path,
        *,
        threaded: bool = True,
        durable: bool = True,
        group_commit: bool = False,
        readers: int = 4,
    ) -> None:
        """`group_commit` (simulator only: it never acts on the outside world)
        folds scheduler batches together and writes them before the next read,
        when they grow large, and on close."""
        self.path = Path(path)
        self._group_commit = group_commit
        self._pending = WriteBatch()
        self._threaded = threaded
        self._synchronous = "FULL" if durable else "OFF"
        self._readers = readers
        self._conn: sqlite3.Connection | None = None
        self._writer: _Writer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._read_conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.schema_version = 0
        self.write_error: str | None = None  # why the last write failed, until one works
        self.write_errors = 0  # writes that failed for want of disk, I/O, ...

    # --- lifecycle -------------------------------------------------------------

    async def open(self) -> None:
        """Open the database (created if need be) and bring its schema up to date."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = _connect(self.path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        if self._group_commit:
            # A group-commit transaction changes more pages than the 2 MB page cache
            # holds: SQLite then spills them to the WAL and writes them again and again
            # (the 100,000-job simulation: 3.0 million page writes, 1.2-1.8 s of system
            # time; without spilling 86,000 writes, 0.5 s, +37 MB peak memory). The
            # transaction is bounded by GROUP_COMMIT_ROWS, so its pages stay in memory.
            conn.execute("PRAGMA cache_spill = OFF")
            # And the simulator's whole database fits in a 128 MB cache (~80 MB for the
            # 100,000-job bench), where each write found most of its B-tree pages out of
            # the 2 MB one and read them again: 27.5 -> 25.2 s CPU, +70 MB peak (370 MB).
            conn.execute("PRAGMA cache_size = -131072")
        self._conn = conn
        if self._threaded:
            self._writer = _Writer(conn)
            self._writer.start()
            self._pool = ThreadPoolExecutor(
                self._readers, thread_name_prefix="spotbag-store-reader"
            )
        self.schema_version = await self.write(migrate)
        built = await self.write(restore_missing_indexes, DEFERRABLE_INDEXES)
        if built:
            log.warning(
                "built the indexes %s, missing (a simulation stopped before it built them)",
                ", ".join(built),
            )

    async def close(self) -> None:
        """Write what is pending, stop the writer and the readers, close the connections."""
        if self._conn is not None:
            await self.flush()
        if self._writer is not None:
            self._writer.jobs.put(None)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for conn in self._read_conns:
            conn.close()
        self._read_conns.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def defer_indexes(self) -> None:
        """Drop DEFERRABLE_INDEXES until `restore_indexes` (a bulk load: nothing reads
        through them meanwhile)."""

        def drop(conn: sqlite3.Connection) -> None:
            for name in DEFERRABLE_INDEXES:
                conn.execute(f"DROP INDEX IF EXISTS {name}")

        await self.write(drop)

    async def restore_indexes(self) -> None:
        """Build those of DEFERRABLE_INDEXES that are missing, as the migrations define
        them, after what is pending is written (again after a failed build; nothing when
        none is missing)."""
        await self.flush()
        await self.write(restore_missing_indexes, DEFERRABLE_INDEXES)

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) in one write transaction on the writer thread. Raises
        StoreUnavailable when the database cannot be written now (`write_error` says
        why until a write succeeds again)."""
        if self._conn is None:
            raise StoreClosed("store is not open")
        try:
            if self._writer is None:
                result = _in_transaction(self._conn, fn, args)
            else:
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._writer.jobs.put((fn, args, future, loop))
                result = await future
        except StoreUnavailable as exc:
            self.write_error = str(exc)
            self.write_errors += 1
            raise
        self.write_error = None
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(conn, *args) on a reader connection (a consistent WAL snapshot)."""
        if self._conn is None:
            raise StoreClosed("store is not open")
        if self._pending:
            await self.flush()
        if self._pool is None:
            return fn(self._conn, *args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._read_in_thread, fn, args)

    def _read_in_thread(self, fn: Callable[..., T], args: tuple) -> T:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            conn.execute("PRAGMA query_only = 1")
            self._local.conn = conn
            with self._lock:
                self._read_conns.append(conn)
        conn.execute("BEGIN")
        try:
            return fn(conn, *args)
        finally:
            conn.execute("COMMIT")

    # --- the scheduler's write batches ---------------------------------------

    def new_batch(self) -> WriteBatch:
        """A batch to record changes in: with group commit, the shared pending one."""
        return self._pending if self._group_commit else WriteBatch()

    async def apply(self, batch: WriteBatch) -> None:
        """Write the scheduler's changes in one transaction (with group commit: once
        enough have gathered, or before the next read)."""
        if not self._group_commit:
            if batch:
                await self.write(apply_batch, batch)
            return
        if batch is not self._pending:  # (the scheduler's are the pending batch itself)
            if not batch:
                return
            self._pending.merge(batch)
        if self._pending.size() > GROUP_COMMIT_ROWS:
            await self.flush()

    async def flush(self) -> None:
        """Write the batch gathered under group commit, if any (otherwise a no-op)."""
        pending, self._pending = self._pending, WriteBatch()
        if pending:
            await self.write(apply_batch, pending)
