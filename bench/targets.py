"""A figure's target beside it, so `make bench` shows at a glance what meets its target
(the targets are the issues' and bench/README.md's), with the machine's load when it was
measured (a figure from a busy host reads differently)."""

import os
from typing import Any


def against(value: float, limit: float, unit: str, *, at_least: bool = False) -> str:
    """`(target <= 3 s: ok; load 0.52)`, or `OVER TARGET` / `UNDER TARGET` when `value`
    misses it; the load is the 1-minute load average as the figure is printed."""
    load = f"load {os.getloadavg()[0]:.2f}"
    if at_least:
        verdict = "ok" if value >= limit else "UNDER TARGET"
        return f"(target >= {limit:g} {unit}: {verdict}; {load})"
    verdict = "ok" if value <= limit else "OVER TARGET"
    return f"(target <= {limit:g} {unit}: {verdict}; {load})"


# --- a machine-independent yardstick ----------------------------------------------------

# CPU seconds of `reference_loop()` on the development machine (2 vCPUs, Python 3.11.7):
# the median of 40 runs, 0.262 s (least 0.242 s), at load 6.4-7.0 with other helpers'
# test suites running, as the figures measured against it were (issue 24). A figure
# given "as a ratio to the reference loop" is its CPU seconds divided by the loop's in
# the same run, so a target of S seconds there is S / REFERENCE_LOOP_DEV_S loops
# anywhere: a faster CPU or interpreter, or a busier machine, moves both.
REFERENCE_LOOP_DEV_S = 0.26


REFERENCE_LOOP_STEPS = 1_000_000


def reference_loop(steps: int = REFERENCE_LOOP_STEPS) -> float:
    """CPU seconds of a fixed pure-Python workload of the scheduler's kind (dict look-ups
    and updates, tuples, float sums, a method call per step): what a faster or slower
    interpreter or CPU, or a busier machine, changes for spotbag's own Python as well.
    (`steps` fewer: a slice of it, run between the passes of what is measured:
    `LoopsThrough`.)"""
    import time

    started = time.process_time()
    counts: dict[int, float] = {}
    rows: list[tuple[int, float]] = []
    total = 0.0
    for i in range(steps):
        key = i & 4095
        counts[key] = counts.get(key, 0.0) + i * 0.5
        rows.append((key, total))
        if len(rows) > 1000:
            rows.clear()
        total += counts[key] * 1e-9
    return time.process_time() - started


def reference_loops(runs: int = 5) -> list[float]:
    """`runs` runs of the reference loop (CPU seconds each): take some before and some
    after what is measured, and divide by their mean (`in_reference_loops`)."""
    return [reference_loop() for _ in range(runs)]


def in_reference_loops(cpu_s: float, loops_s: list[float], target_dev_s: float) -> str:
    """`12.3 s CPU = 49.2 reference loops (a loop 0.250 s on this run; target <= 60 loops
    = 15 s on the development machine: ok)`.

    The loop is the loops' mean, not their median: on a shared host the CPU's speed
    flips between phases within seconds (a loop here took 0.30 s in one, 0.55 s in
    another), and what is measured, longer than a loop, runs through them all, so its
    CPU time is its work at the mean speed of the phases; so is the mean of loops spread
    around it, while their median is the speed of the commonest phase alone. (The
    development machine's REFERENCE_LOOP_DEV_S is the median of its 40 loops; the ratio
    against the median is printed too.)"""
    import statistics

    loop_s = statistics.mean(loops_s)
    ratio, limit = cpu_s / loop_s, target_dev_s / REFERENCE_LOOP_DEV_S
    verdict = "ok" if ratio <= limit else "OVER TARGET"
    median_s = statistics.median(loops_s)
    return (
        f"{cpu_s:.1f} s CPU = {ratio:.1f} reference loops (a loop {loop_s:.3f} s CPU on this "
        f"run, the mean of {len(loops_s)}, {min(loops_s):.3f}-{max(loops_s):.3f} s; against "
        f"their median, {median_s:.3f} s, {cpu_s / median_s:.1f} loops; target <= {limit:.0f} "
        f"loops = {target_dev_s:g} s on the development machine: {verdict})"
    )


def load_average() -> str:
    """`load 1.23 / 2.00 / 3.10 on 2 CPUs`: the 1-, 5- and 15-minute load averages."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


# --- the reference loop run through what is measured -------------------------------------

LOOP_SLICES = 10  # a slice is a tenth of the reference loop
SLICE_EVERY_CPU_S = 0.5  # of the measured work's CPU between two slices


class LoopsThrough:
    """The reference loop run in slices (a tenth each) between the virtual clock's steps
    of a simulation, every SLICE_EVERY_CPU_S of its CPU, in its own process: the loop
    then meets the host in the same phases as the simulation does.

    This host's CPU speed flips between phases within seconds (a whole loop took 0.29 s
    in one, 0.60 s in another), and loops run before and after a 20-s simulation met
    other phases than it did: the same code measured 43 to 75 loops from one run to
    the next that way, within a few loops this way (bench/README.md). The slices' CPU
    is taken out of the measured CPU."""

    def __init__(self) -> None:
        self.slices_s: list[float] = []  # CPU seconds of each slice
        self._saved: Any = None  # SimClock.advance_to, put back on exit

    def __enter__(self) -> "LoopsThrough":
        import time

        from controller.clock import SimClock

        real_advance_to = SimClock.advance_to
        slices = self.slices_s
        last = [time.process_time()]

        def advance_to(clock: SimClock, when: float) -> None:
            real_advance_to(clock, when)
            if time.process_time() - last[0] >= SLICE_EVERY_CPU_S:
                slices.append(reference_loop(REFERENCE_LOOP_STEPS // LOOP_SLICES))
                last[0] = time.process_time()

        self._saved = real_advance_to
        SimClock.advance_to = advance_to  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from controller.clock import SimClock

        SimClock.advance_to = self._saved  # type: ignore[method-assign]


def in_loops_through(work_cpu_s: float, slices_s: list[float], target_dev_s: float) -> str:
    """`12.3 s CPU = 49.2 reference loops run through it (...)`: the verdict against
    the target, for work of `work_cpu_s` (the loop's slices `slices_s` run through it,
    LoopsThrough, already taken out)."""
    import statistics

    loops_s = [s * LOOP_SLICES for s in slices_s]  # each slice as the whole loop
    if not loops_s:
        return f"{work_cpu_s:.1f} s CPU (too short for a slice of the reference loop)"
    loop_s = statistics.mean(loops_s)
    ratio, limit = work_cpu_s / loop_s, target_dev_s / REFERENCE_LOOP_DEV_S
    verdict = "ok" if ratio <= limit else "OVER TARGET"
    return (
        f"{work_cpu_s:.1f} s CPU = {ratio:.1f} reference loops run through it (a loop "
        f"{loop_s:.3f} s CPU, the mean of {len(loops_s)} tenths of one between its steps, "
        f"{min(loops_s):.3f}-{max(loops_s):.3f} s; target <= {limit:.0f} loops = "
        f"{target_dev_s:g} s on the development machine: {verdict})"
    )
