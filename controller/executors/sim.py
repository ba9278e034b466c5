"""The sim executor: attempts that take a declared time on the virtual clock.

An attempt's runtime is its job's parameter named by the bag's
`simulation.runtime_param`, else the bag's `simulation.runtime_s`, else its
`estimated_runtime_s`, else `max_runtime_s`; with `simulation.runtime_cv` > 0
it is lognormal with that mean and coefficient of variation. An attempt fails
with `simulation.failure_probability`. Runtimes beyond max_runtime_s time out.
Draws come from one seeded generator in start order, so a run is reproducible.

Checkpoints: an attempt runs only the work its job has not saved yet
(`resume_work_s`). Asked to checkpoint, it pauses for `checkpoint_cost_s`, then
reports the checkpoint written and carries on; its end moves back by that much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from controller.executors.base import (
    AttemptEvent,
    AttemptListener,
    AttemptSpec,
    CheckpointEvent,
    LiveAttempt,
    Outcome,
)
from drivers.base import VmType


class SimExecutor:
    name = "sim"
    joins_vms = False
    queues_attempts = False
    attempts_outlive_controller = False
    confirms_ends = False  # vm_lost kills the attempts at once
    queue_ahead = 0.0
    backlog_pass_interval_s = 0.0

    def __init__(
        self,
        *,
        now: Callable[[], float],
        call_at: Callable[[float, Callable[[], None]], Any],
        rng: np.random.Generator,
    ) -> None:
        self._now = now
        self._call_at = call_at
        self._rng = rng
        self._timers: dict[str, tuple[str, Any]] = {}  # attempt id -> (vm id, timer)
        self._ends: dict[str, tuple[AttemptSpec, AttemptEvent, float]] = {}  # -> (spec, end, at)
        self._writing: dict[str, Any] = {}  # attempt id -> timer of its checkpoint in progress
        self._by_vm: dict[str, dict[str, None]] = {}  # vm id -> its attempt ids (ordered)
        self._normals: list[float] = []  # standard normal draws, taken in blocks (fast)
        self._listeners: list[AttemptListener] = []

    def subscribe(self, listener: AttemptListener) -> None:
        self._listeners.append(listener)

    def log_path(self, bag_id: str, job_id: str, number: int) -> str:
        return ""

    def bootstrap_values(self, vm_id: str, vm_type: VmType, pool_node: str = "") -> dict[str, str]:
        return {}

    async def vm_started(self, vm_id: str, vm_type: VmType) -> None:
        return None

    def _runtime_s(self, spec: AttemptSpec) -> float:
        hints = spec.simulation
        own = spec.params.get(hints.runtime_param) if hints and hints.runtime_param else None
        if isinstance(own, int | float) and not isinstance(own, bool) and own > 0:
            mean: float | None = float(own)  # the job's own runtime (jobs of many lengths)
        else:
            mean = hints.runtime_s if hints and hints.runtime_s else None
        mean = mean or spec.estimated_runtime_s
        mean = mean or spec.max_runtime_s
        cv = hints.runtime_cv if hints else 0.0
        if cv <= 0:
            return mean
        sigma2 = math.log1p(cv * cv)
        if not self._normals:
            self._normals = self._rng.standard_normal(4096).tolist()[::-1]
        z = self._normals.pop()
        return math.exp(math.log(mean) - sigma2 / 2 + math.sqrt(sigma2) * z)

    def enqueue(self, spec: AttemptSpec) -> bool:
        return False  # no queue: a start runs the attempt at once

    async def start(self, spec: AttemptSpec) -> str:
        runtime_s = max(0.0, self._runtime_s(spec) - spec.resume_work_s)
        hints = spec.simulation
        fails = bool(
            hints and hints.failure_probability and self._rng.random() < hints.failure_probability
        )
        if runtime_s > spec.max_runtime_s:
            end = AttemptEvent(
                spec.attempt_id,
                0.0,
                Outcome.TIMED_OUT,
                None,
                f"exceeded max_runtime_s={spec.max_runtime_s:g}",
            )
            runtime_s = spec.max_runtime_s
        elif hints is not None and fails:
            end = AttemptEvent(spec.attempt_id, 0.0, Outcome.EXITED, hints.failure_exit_code)
        else:
            end = AttemptEvent(spec.attempt_id, 0.0, Outcome.EXITED, 0)
        end_at = self._now() + runtime_s
        timer = self._call_at(end_at, lambda: self._finish(end))
        self._timers[spec.attempt_id] = (spec.vm_id, timer)
        self._ends[spec.attempt_id] = (spec, end, end_at)
        on_vm = self._by_vm.get(spec.vm_id)
        if on_vm is None:
            on_vm = self._by_vm[spec.vm_id] = {}
        on_vm[spec.attempt_id] = None
        return ""

    async def signal_checkpoint(self, attempt_id: str, timeout_s: float) -> None:
        if attempt_id not in self._timers or attempt_id in self._writing:
            return
        spec, end, end_at = self._ends[attempt_id]
        requested_at = self._now()
        cost_s = spec.checkpoint_cost_s
        if end.outcome is not Outcome.TIMED_OUT:  # a time limit does not move
            vm_id, timer = self._timers[attempt_id]
            timer.cancel()
            end_at += cost_s
            self._timers[attempt_id] = (vm_id, self._call_at(end_at, lambda: self._finish(end)))
            self._ends[attempt_id] = (spec, end, end_at)

        def written() -> None:
            self._writing.pop(attempt_id, None)
            self._emit(CheckpointEvent(attempt_id, requested_at, self._now(), True))

        self._writing[attempt_id] = self._call_at(requested_at + cost_s, written)

    def _forget(self, attempt_id: str) -> Any:
        vm_id, timer = self._timers.pop(attempt_id)
        self._ends.pop(attempt_id, None)
        writing = self._writing.pop(attempt_id, None)
        if writing is not None:
            writing.cancel()
        self._by_vm[vm_id].pop(attempt_id, None)
        return timer

    def _finish(self, end: AttemptEvent) -> None:
        self._forget(end.attempt_id)
        self._emit(
            AttemptEvent(end.attempt_id, self._now(), end.outcome, end.exit_code, end.detail)
        )

    def _emit(self, event: AttemptEvent | CheckpointEvent) -> None:
        for listener in self._listeners:
            listener(event)

    async def cancel(self, attempt_id: str) -> None:
        if attempt_id in self._timers:
            self._forget(attempt_id).cancel()
            self._emit(AttemptEvent(attempt_id, self._now(), Outcome.KILLED, None, "cancelled"))

    async def vm_lost(self, vm_id: str, pool_node: str = "") -> None:
        for attempt_id in list(self._by_vm.get(vm_id, {})):
            self._forget(attempt_id).cancel()
        self._by_vm.pop(vm_id, None)

    async def recover(
        self, attempts: Sequence[LiveAttempt], live_vm_ids: Sequence[str] = ()
    ) -> set[str]:
        return {a.attempt_id for a in attempts if a.attempt_id in self._timers}

    def vms_settling(self) -> tuple[str, ...]:
        return ()  # an attempt ends when its timer does

    def backlogged(self) -> bool:
        return False  # it queues nothing

    async def shutdown(self) -> None:
        for _, timer in self._timers.values():
            timer.cancel()
        for timer in self._writing.values():
            timer.cancel()
        self._timers.clear()
        self._ends.clear()
        self._writing.clear()
        self._by_vm.clear()
