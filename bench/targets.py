"""A figure's target beside it, so `make bench` shows at a glance what meets its target
(the targets are the issues' and bench/README.md's), with the machine's load when it was
measured (a figure from a busy host reads differently)."""

import os


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


def reference_loop() -> float:
    """CPU seconds of a fixed pure-Python workload of the scheduler's kind (dict look-ups
    and updates, tuples, float sums, a method call per step): what a faster or slower
    interpreter or CPU, or a busier machine, changes for spotbag's own Python as well."""
    import time

    started = time.process_time()
    counts: dict[int, float] = {}
    rows: list[tuple[int, float]] = []
    total = 0.0
    for i in range(1_000_000):
        key = i & 4095
        counts[key] = counts.get(key, 0.0) + i * 0.5
        rows.append((key, total))
        if len(rows) > 1000:
            rows.clear()
        total += counts[key] * 1e-9
    return time.process_time() - started


def reference_loops(runs: int = 5) -> list[float]:
    """`runs` runs of the reference loop (CPU seconds each): take some before and some
    after what is measured, and divide by their median."""
    return [reference_loop() for _ in range(runs)]


def in_reference_loops(cpu_s: float, loops_s: list[float], target_dev_s: float) -> str:
    """`12.3 s CPU = 49.2 reference loops (a loop 0.250 s on this run; target <= 60 loops
    = 15 s on the development machine: ok)`."""
    import statistics

    loop_s = statistics.median(loops_s)
    ratio, limit = cpu_s / loop_s, target_dev_s / REFERENCE_LOOP_DEV_S
    verdict = "ok" if ratio <= limit else "OVER TARGET"
    return (
        f"{cpu_s:.1f} s CPU = {ratio:.1f} reference loops (a loop {loop_s:.3f} s CPU on this "
        f"run; target <= {limit:.0f} loops = {target_dev_s:g} s on the development machine: "
        f"{verdict})"
    )


def load_average() -> str:
    """`load 1.23 / 2.00 / 3.10 on 2 CPUs`: the 1-, 5- and 15-minute load averages."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


class LoopsAlongside:
    """The reference loop run over and over in a process of its own while something is
    measured, both held to one CPU, which they share: the loops see the same CPU, at the
    same moments, as what is measured. On a shared host the loop's CPU time moves by
    half within seconds (0.29-0.58 s here), so a few loops before and after a 30-s run
    may fall in another phase than most of the run; ~60 loops spread over it do not.
    Each process's CPU time is its own, so sharing the CPU doubles the wall time only.

        with LoopsAlongside() as loops:
            ...  # measured: CPU seconds of this process (or of its children)
        loops.times_s  # each loop's CPU seconds (those that ran to their end)
    """

    def __init__(self, cpu: int | None = None) -> None:
        allowed = sorted(os.sched_getaffinity(0))
        self.cpu = allowed[0] if cpu is None else cpu
        self.times_s: list[float] = []

    def __enter__(self) -> "LoopsAlongside":
        import subprocess
        import sys

        self._affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})  # inherited by what this process starts
        self._process = subprocess.Popen(
            [sys.executable, "-c", _LOOPS_FOREVER, os.path.dirname(os.path.abspath(__file__))],
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        out, _ = self._process.communicate()
        os.sched_setaffinity(0, self._affinity)
        # A loop is printed when it ends: the one cut short by the end is not.
        self.times_s = [float(line) for line in out.split()]


_LOOPS_FOREVER = """
import signal, sys
sys.path.insert(0, sys.argv[1])
from targets import reference_loop
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    print(f"{reference_loop():.6f}", flush=True)
"""
