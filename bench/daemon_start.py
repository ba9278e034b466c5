#!/usr/bin/env python3
"""Benchmark: how soon a starting daemon answers, against importing what it needs.

The daemon listens first, then loads (controller/service.py; issue 24). Alternately,
ROUNDS times: `python -c "import numpy, scipy.stats, aiohttp"` (the libraries the daemon
cannot do without, imported and nothing else), and `spotbag serve --config
examples/demo.toml` on a fresh state directory, timed from the start of its process
until GET /healthz answers (503 "starting" or 200), and until it is ready (200 "ok"),
then stopped with SIGTERM. Prints the medians (wall-clock seconds) and the first ratio
against its target: /healthz answering within 1.5 x the imports. The machine's load is
printed beside them: the figures are wall times, which other work on the machine
stretches (alternating the two keeps the ratio fair).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

REPO = Path(__file__).resolve().parent.parent
IMPORTS = "import numpy, scipy.stats, aiohttp"
TARGET_RATIO = 1.5
POLL_S = 0.005


def spotbag() -> list[str]:
    """The installed `spotbag` command beside this Python, as users run it."""
    script = Path(sys.executable).parent / "spotbag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "controller.cli"]


def imports_s() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True)
    return time.monotonic() - started


def healthz(url: str) -> str:
    """/healthz's status; '' while nothing answers."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=30) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (urllib.error.URLError, OSError):
        return ""
    return str(json.loads(body)["status"])


def daemon_start_s() -> tuple[float, float]:
    """Seconds from the daemon's start until /healthz answers, and until it is ready."""
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-start-") as tmp:
        state = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
        command = [*spotbag(), "--state-dir", str(state), "serve", "--config"]
        started = time.monotonic()
        process = subprocess.Popen(
            [*command, str(REPO / "examples" / "demo.toml")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=REPO,
        )
        try:
            url_file, answered, url = state / "api.url", None, ""
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"the daemon exited with status {process.returncode}")
                if not url and url_file.exists():
                    url = url_file.read_text().strip()
                status = healthz(url) if url else ""
                if status and answered is None:
                    answered = time.monotonic() - started
                if status == "ok":
                    assert answered is not None
                    return answered, time.monotonic() - started
                time.sleep(POLL_S)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    # As pip does at install: a process then reads spotbag's modules compiled, as it
    # reads click's (PYTHONDONTWRITEBYTECODE would otherwise compile them every time).
    for package in ("controller", "drivers", "policies"):
        compileall.compile_dir(REPO / package, quiet=1)
    imports, answers, readies = [], [], []
    for _ in range(args.rounds):
        imports.append(imports_s())
        answered, ready = daemon_start_s()
        answers.append(answered)
        readies.append(ready)
    load = os.getloadavg()
    base, answer, ready = (statistics.median(x) for x in (imports, answers, readies))
    print(
        f"daemon start ({args.rounds} rounds alternated, medians; load {load[0]:.1f} "
        f"{load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs):"
    )
    print(f'  python -c "{IMPORTS}": {base:.2f} s')
    ratio = answer / base
    print(
        f"  spotbag serve until GET /healthz answers: {answer:.2f} s = {ratio:.2f} x the "
        f"imports {against(ratio, TARGET_RATIO, 'x')}"
    )
    print(f"  spotbag serve until ready (/healthz status ok): {ready:.2f} s = {ready / base:.2f} x")


if __name__ == "__main__":
    main()
