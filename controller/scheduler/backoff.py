"""Back-off after failed actions, a collaborator of the scheduler (`Scheduler.backoff`).

`Backoff` holds the VM types blocked after failed launches and the pause in starts after
the executor could not take attempts; the planner's snapshot reads both
(controller/scheduler/planning.py) and the acting half of a pass updates them
(controller/scheduler/actions.py). Both delays start at `launch_backoff_s` and double,
up to `launch_backoff_max_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from controller.config import SchedulerConfig
from controller.executors.base import ExecutorUnavailable
from controller.scheduler.runs import VmRun
from drivers.base import PermanentError, VmStatus

log = logging.getLogger("spotbag.scheduler")


class Backoff:
    """Back-off after failed actions: per VM type after failed launches, and for all
    starts after the executor could not take attempts (Slurm down, the host out of
    descriptors or memory)."""

    def __init__(self, settings: SchedulerConfig, executor_name: str) -> None:
        self.settings = settings
        self.executor_name = executor_name
        # Per VM type, after failed launches (blocked until, last delay): spot and
        # on-demand apart (no spot capacity, or a spot price above the bid, says nothing
        # of on-demand capacity: a deadline's on-demand VMs are launched meanwhile).
        self.types: dict[str, tuple[float, float]] = {}  # spot launches
        self.on_demand_types: dict[str, tuple[float, float]] = {}
        # The executor could not take attempts: no new ones until then.
        self.starts_blocked_until = 0.0
        self.starts_backoff_s = 0.0
        self.starts_failing = False  # since the first pass it could not, until one it could

    def blocked_types(self, spot: bool = True) -> dict[str, float]:
        """Until when each backed-off VM type may not be launched on the market (for the
        planner)."""
        types = self.types if spot else self.on_demand_types
        return {t: until for t, (until, _) in types.items()}

    def after_starts(self, error: ExecutorUnavailable | None, now: float, started: bool) -> None:
        """After the executor could not take attempts, start none for a while (from
        launch_backoff_s, doubling up to launch_backoff_max_s); a pass whose starts all
        went through clears it. Logged once per burst: a warning when it begins (the
        passes after it, while it lasts, only at debug level) and a line when it ends,
        however many attempts and passes it held back."""
        if error is None:
            if started:
                if self.starts_failing:
                    log.info("the %s executor takes attempts again", self.executor_name)
                self.starts_failing = False
                self.starts_backoff_s = 0.0
            return
        first, self.starts_failing = not self.starts_failing, True
        base, most = self.settings.launch_backoff_s, self.settings.launch_backoff_max_s
        self.starts_backoff_s = min(most, max(base, 2 * self.starts_backoff_s))
        self.starts_blocked_until = now + self.starts_backoff_s
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "the %s executor cannot take attempts (%s); none is counted against its job's "
            "max_attempts; no new ones for %.0f s%s",
            self.executor_name,
            error,
            self.starts_backoff_s,
            ", then longer while this lasts (said again when it ends)" if first else "",
        )

    def after_launches(
        self, launched: Sequence[tuple[VmRun, VmStatus | None, Exception | None]], now: float
    ) -> None:
        """Back a VM type off after a pass in which its launches failed.

        The delay starts at launch_backoff_s and doubles (up to launch_backoff_max_s)
        only when the type fails again soon after its last back-off ended; a
        PermanentError blocks it for the maximum at once. Once per type per pass,
        however many of its launches failed; a pass with only successes clears it.
        """
        if not launched:
            return
        errors: dict[tuple[str, bool], Exception] = {}
        succeeded: set[tuple[str, bool]] = set()
        for vm, _, error in launched:
            if error is None:
                succeeded.add((vm.vm_type.name, vm.spot))
            else:
                errors[(vm.vm_type.name, vm.spot)] = error
        base, most = self.settings.launch_backoff_s, self.settings.launch_backoff_max_s
        for (name, spot), error in errors.items():
            types = self.types if spot else self.on_demand_types
            until, last = types.get(name, (0.0, 0.0))
            again_soon = last > 0 and now - until <= last
            delay = (
                most
                if isinstance(error, PermanentError)
                else (min(most, 2 * last) if again_soon else base)
            )
            types[name] = (now + delay, delay)
            log.warning(
                "VM type %s backed off for %s launches for %.0f s after: %s",
                name,
                "spot" if spot else "on-demand",
                delay,
                error,
            )
        for name, spot in succeeded - errors.keys():
            (self.types if spot else self.on_demand_types).pop(name, None)
