#!/usr/bin/env python3
"""Benchmark: the offline tools as README runs them, each a new `spotbag` process on the
shipped data, timed in CPU seconds (user + system, the process and its children).

`fit` (target <= 1 s CPU, issue 24), `fit --by machine_type`, the same with `--plot`,
`checkpoint-plan` as README's example, `index --by zone --plot` and
`simulate-hopping --policy all` on the shipped trace. Each command runs once to write
its bytecode (as any second run finds it), then RUNS times; the median and every run
are printed, with each as a ratio to the pure-Python reference loop of bench/targets.py
run in the same benchmark (so a figure from another machine compares), and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import (
    REFERENCE_LOOP_DEV_S,
    against,
    load_average,
    reference_loops,
)

from controller.traces.reference_data import LIFETIMES, SPOT_PRICES

ROOT = Path(__file__).resolve().parent.parent


def commands(out: Path) -> list[tuple[str, list[str], float | None]]:
    """(what, arguments, target CPU seconds or None) for each command README shows."""
    return [
        ("fit on the shipped lifetimes", ["fit", str(LIFETIMES)], 1.0),
        ("fit --by machine_type", ["fit", str(LIFETIMES), "--by", "machine_type"], None),
        (
            "fit --by machine_type --plot",
            ["fit", str(LIFETIMES), "--by", "machine_type", "--plot", str(out / "fits.png")],
            None,
        ),
        (
            "checkpoint-plan (README's example)",
            [
                "checkpoint-plan",
                "--model",
                "gce/n1-highcpu-16",
                "--work",
                "5h",
                "--delta",
                "1m",
                "--compare",
                "young-daly",
                "--mttf",
                "1h",
            ],
            None,
        ),
        (
            "index --by zone --plot (shipped trace)",
            ["index", str(SPOT_PRICES), "--by", "zone", "--plot", str(out / "index.png")],
            None,
        ),
        (
            "simulate-hopping --job 2:10 --policy all (shipped trace)",
            ["simulate-hopping", str(SPOT_PRICES), "--job", "2:10", "--policy", "all"],
            None,
        ),
    ]


def cpu_of(arguments: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `spotbag ARGUMENTS` process."""
    # Bytecode is written as a user's install writes it (a shell may forbid it).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", *arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        assert process.stderr is not None
        raise SystemExit(f"spotbag {' '.join(arguments)} failed: {process.stderr.read().decode()}")
    return usage.ru_utime + usage.ru_stime, wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per command")
    args = parser.parse_args()
    loops = reference_loops()
    with tempfile.TemporaryDirectory(prefix="spotbag-cli-tools-") as tmp:
        rows = []
        for what, arguments, target in commands(Path(tmp)):
            cpu_of(arguments)  # writes the bytecode; not timed
            runs = [cpu_of(arguments) for _ in range(args.runs)]
            cpu = statistics.median(c for c, _ in runs)
            # The verdict and the load as the runs end (the figures print after all of them).
            verdict = (
                against(cpu, target, "s CPU")
                if target is not None
                else f"(no target; {load_average()})"
            )
            rows.append((what, cpu, runs, verdict))
    loops += reference_loops()
    loop_s = statistics.median(loops)
    print(
        f"reference loop: {loop_s:.3f} s CPU (median of {len(loops)}, before and after; "
        f"{REFERENCE_LOOP_DEV_S:.3f} s on the development machine)"
    )
    for what, cpu, runs, verdict in rows:
        wall = statistics.median(w for _, w in runs)
        print(
            f"spotbag {what}: median {cpu:.2f} s CPU = {cpu / loop_s:.1f} reference loops, "
            f"{wall:.2f} s wall (CPU runs: {', '.join(f'{c:.2f}' for c, _ in runs)}) {verdict}"
        )


if __name__ == "__main__":
    main()
