#!/usr/bin/env python3
"""Benchmark: the CLI's CPU time against its framework's (issue 24).

Alternately, ROUNDS times each: `python -c "import click, rich"` (what any click + rich
command costs before it does anything), `spotbag --help`, `spotbag status` (the list of
bags) and `spotbag status BAG` (one bag's summary, with the whole fleet's line), the last
two against a real daemon (local driver) holding one finished bag. Each is a fresh
process; its CPU time (user + system, from wait4) is taken, not its wall time, which
other work on the machine stretches. Prints the medians and their ratios to the
framework's, against the targets: --help within 1.5 x, status within 2 x; and the
machine's load.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

from tests.conftest import REPO, Daemon, wait_for_bag

FRAMEWORK = "import click, rich"
CONFIG = """
[api]
port = 0
token = "bench"
[driver]
name = "local"
boot_delay_s = 0.1
"""


def spotbag() -> list[str]:
    """The installed `spotbag` command beside this Python, as users run it."""
    script = Path(sys.executable).parent / "spotbag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "controller.cli"]


def cpu_s(command: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one run of `command` (which must succeed)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{command} exited with {process.returncode}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    # As pip does at install: a process then reads spotbag's modules compiled, as it
    # reads click's (PYTHONDONTWRITEBYTECODE would otherwise compile them every time).
    for package in ("controller", "drivers", "policies"):
        compileall.compile_dir(REPO / package, quiet=1)
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-cli-") as tmp:
        state = Path(tmp)
        (state / "spotbag.toml").write_text(CONFIG)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        try:
            bag = client.submit({"account": "a", "command": "true", "max_runtime_s": 30})
            wait_for_bag(client, bag["id"])
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
            env["SPOTBAG_STATE_DIR"] = str(state)
            commands = {
                f'python -c "{FRAMEWORK}"': [sys.executable, "-c", FRAMEWORK],
                "spotbag --help": [*spotbag(), "--help"],
                "spotbag status": [*spotbag(), "status"],
                "spotbag status BAG": [*spotbag(), "status", bag["id"]],
            }
            taken: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.rounds):
                for name, command in commands.items():
                    taken[name].append(cpu_s(command, env))
        finally:
            daemon.stop()
    load = os.getloadavg()
    median = {name: statistics.median(values) for name, values in taken.items()}
    base = median[f'python -c "{FRAMEWORK}"']
    print(
        f"CLI CPU time ({args.rounds} rounds alternated, medians; load {load[0]:.1f} "
        f"{load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs):"
    )
    print(f'  python -c "{FRAMEWORK}": {1000 * base:.0f} ms')
    for name, limit in (("spotbag --help", 1.5), ("spotbag status", 2), ("spotbag status BAG", 2)):
        ratio = median[name] / base
        print(
            f"  {name}: {1000 * median[name]:.0f} ms = {ratio:.2f} x {against(ratio, limit, 'x')}"
        )


if __name__ == "__main__":
    main()
