"""Solved checkpoint tables (policies.checkpoint.CheckpointTable), cached so that the
scheduler answers "when should this job checkpoint next?" by lookup.

A table is solved once per (model, δ, restart, step, size): the size is the
remaining work it covers, rounded up a ladder of 1, 2, 4, 8, 16, 24 ... hours (up to
`max_work_h`) so that short jobs never wait for a 24-hour table. Tables live in
memory (the few most recently used) and on disk under
STATE_DIR/checkpoint-tables/ as .npz files named by a hash of their key, so a
restarted daemon loads in milliseconds what took seconds to solve.

Solving is CPU work: the daemon solves in a worker thread (`asyncio.to_thread`)
and asks again on its next pass (`on_ready` wakes it); meanwhile the caller gets
None and plans with Young–Daly. The simulator and the CLI solve inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from policies.checkpoint import CheckpointTable, build_table, delta_steps
from policies.checkpoint_notices import Notices, solve_with_notices
from policies.preemption import LifetimeModel

log = logging.getLogger("spotbag.checkpoints")

FORMAT_VERSION = 2
SIZE_LADDER_H = (1.0, 2.0, 4.0, 8.0, 16.0, 24.0)

# model, δ steps, R h, step h, size h, planned for notices
TableKey = tuple[LifetimeModel, int, float, float, float, bool]


def planned_notices(notice_lead_s: float) -> Notices | None:
    """The notices a driver that gives them `notice_lead_s` model seconds ahead of every
    preemption asks the tables to plan for (None: it gives none)."""
    return Notices(notice_lead_s / 3600.0) if notice_lead_s > 0 else None


def table_size_h(work_h: float, max_work_h: float) -> float:
    """The smallest size on the ladder (then doubling) that covers `work_h`, at most
    `max_work_h`."""
    for size in SIZE_LADDER_H:
        if work_h <= size:
            return min(size, max_work_h)
    size = SIZE_LADDER_H[-1]
    while size < work_h:
        size *= 2
    return min(size, max_work_h)


class TableCache:
    def __init__(
        self,
        directory: Path | None,
        *,
        step_h: float,
        restart_h: float,
        max_work_h: float,
        memory_tables: int = 6,
        inline: bool = False,
        on_ready: Callable[[], None] | None = None,
        notices: Notices | None = None,
    ) -> None:
        self.directory = directory
        # Preemption notices the tables plan for (docs/design.md#checkpoint-notices), in
        # model hours; None: none.
        self.notices = notices
        self.step_h = step_h
        self.restart_h = restart_h
        self.max_work_h = max_work_h
        self.inline = inline  # solve in the caller (simulator, CLI) instead of a thread
        self.on_ready = on_ready
        self._memory: OrderedDict[TableKey, CheckpointTable] = OrderedDict()
        self._limit = memory_tables
        self._building: dict[TableKey, asyncio.Task] = {}
        self._lock = threading.Lock()
        self.solved = 0  # tables solved here (not loaded), for tests and logs
        self.loaded = 0  # tables read from disk

    def key(self, model: LifetimeModel, delta_h: float, work_h: float) -> TableKey:
        size = table_size_h(work_h, self.max_work_h)
        # Notices are planned for when the job's own δ fits in their lead (its δ on the
        # grid may be longer: the grid's δ is only what the plan spends per checkpoint).
        noticed = self.notices is not None and self.notices.useful(delta_h)
        return (
            model,
            delta_steps(delta_h, self.step_h),
            round(self.restart_h, 9),
            self.step_h,
            size,
            noticed,
        )

    def lookup(self, model: LifetimeModel, delta_h: float, work_h: float) -> CheckpointTable | None:
        """The table for (model, δ) that covers `work_h`, or None while it is being solved
        (the daemon starts that in a worker thread; inline, it is solved now)."""
        key = self.key(model, delta_h, work_h)
        for size in _sizes_from(key[4], self.max_work_h):  # a bigger table answers too
            bigger = (*key[:4], size, key[5])
            table = self._memory.get(bigger)
            if table is not None:
                self._memory.move_to_end(bigger)
                return table
        if self.inline:
            return self._remember(key, self._load_or_solve(key))
        if key not in self._building:
            self._building[key] = asyncio.create_task(
                self._solve_later(key), name="checkpoint table"
            )
        return None

    async def get(self, model: LifetimeModel, delta_h: float, work_h: float) -> CheckpointTable:
        """The table, solving it (in a worker thread) if needed."""
        table = self.lookup(model, delta_h, work_h)
        if table is not None:
            return table
        return await asyncio.shield(self._building[self.key(model, delta_h, work_h)])

    async def _solve_later(self, key: TableKey) -> CheckpointTable:
        try:
            table = await asyncio.to_thread(self._load_or_solve, key)
            self._remember(key, table)
            if self.on_ready is not None:
                self.on_ready()
            return table
        except Exception:
            log.exception("solving the checkpoint table for %s failed", _describe(key))
            raise
        finally:
            self._building.pop(key, None)

    def _remember(self, key: TableKey, table: CheckpointTable) -> CheckpointTable:
        self._memory[key] = table
        self._memory.move_to_end(key)
        while len(self._memory) > self._limit:
            self._memory.popitem(last=False)
        return table

    def _path(self, key: TableKey) -> Path | None:
        if self.directory is None:
            return None
        digest = hashlib.sha256(self._describe(key).encode()).hexdigest()[:24]
        return self.directory / f"{digest}.npz"

    def _load_or_solve(self, key: TableKey) -> CheckpointTable:
        path = self._path(key)
        if path is not None:
            table = _load(path, self._describe(key))
            if table is not None:
                with self._lock:
                    self.loaded += 1
                return table
        model, delta, restart_h, step_h, size_h, noticed = key
        if noticed and self.notices is not None:
            table = solve_with_notices(
                model, size_h, delta * step_h, self.notices, restart_h, step_h
            )
        else:
            table = build_table(model, size_h, delta * step_h, restart_h, step_h)
        with self._lock:
            self.solved += 1
        if path is not None:
            try:
                _save(path, self._describe(key), table)
            except OSError as exc:  # a cache that cannot be written is only slower
                log.warning("cannot cache the checkpoint table in %s: %s", path, exc)
        return table

    def _describe(self, key: TableKey) -> str:
        """What a stored table is: its key, and the notices it plans for if any."""
        if not key[5] or self.notices is None:
            return _describe(key)
        return f"{_describe(key)} notice_h={self.notices.lead_h!r} share={self.notices.share!r}"


def _sizes_from(size_h: float, max_work_h: float) -> list[float]:
    sizes = [size_h]
    for candidate in (*SIZE_LADDER_H, max_work_h):
        if size_h < candidate <= max_work_h and candidate not in sizes:
            sizes.append(candidate)
    return sorted(sizes)


def _describe(key: TableKey) -> str:
    model, delta, restart_h, step_h, size_h, _ = key
    return (
        f"v{FORMAT_VERSION} {model!r} delta_steps={delta} restart_h={restart_h!r} "
        f"step_h={step_h!r} size_h={size_h!r}"
    )


def _save(path: Path, description: str, table: CheckpointTable) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        np.savez(
            out,
            key=np.array(description),
            scalars=np.array(
                [
                    table.step_h,
                    table.delta_steps,
                    table.restart_h,
                    table.max_steps,
                    table.ages,
                    float(table.deadline),
                ]
            ),
            makespan=table.makespan,
            choice=table.choice,
        )
    os.replace(tmp, path)


def _load(path: Path, description: str) -> CheckpointTable | None:
    """The table stored at `path` if it is the one described (None otherwise)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["key"]) != description:
                return None  # a hash collision or an older format: solve again
            step_h, delta, restart_h, max_steps, ages, deadline = data["scalars"].tolist()
            return CheckpointTable(
                step_h,
                int(delta),
                restart_h,
                int(max_steps),
                int(ages),
                data["makespan"],
                data["choice"],
                bool(deadline),
            )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring the unreadable checkpoint table %s: %s", path, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
