"""`make fuzz`: a long schemathesis run against a live daemon's /openapi.json.

The same daemon set-up and checks as the bounded run in `make test`
(tests/integration/test_openapi_fuzz.py, tests/integration/schemathesis.toml), with
many more examples per operation and the stateful phase (sequences of calls that
follow the document's links), through the schemathesis CLI, which reports each
failure with a curl line to reproduce it. Afterwards the daemon's log must hold no
traceback, and its own count of answers (/metrics, by status) no 5xx; both are
printed. Exit status: non-zero when any of them found something.

    python -m tests.fuzz_api [--max-examples 500] [--seed N] [--max-time S] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from pathlib import Path

from tests.integration.test_openapi_fuzz import (
    CONFIG_FILE,
    TOKEN,
    TOKEN_VARIABLE,
    start_fuzz_daemon,
    tracebacks,
)


def answers_by_status(url: str) -> Counter[int]:
    """The daemon's answers so far per HTTP status, from its /metrics counter."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    counts: Counter[int] = Counter()
    for status, value in re.findall(
        r'^spotbag_http_requests_total\{[^}]*status="(\d+)"[^}]*\} (\S+)$', text, re.M
    ):
        counts[int(status)] += int(float(value))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=500, help="per operation and phase")
    parser.add_argument("--seed", type=int, help="default: the config's (a repeatable run)")
    parser.add_argument("--max-time", type=int, help="stop after this many seconds")
    parser.add_argument("--keep", type=Path, help="state directory to keep (default: a temp one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="spotbag-fuzz-") as scratch:
        state = args.keep or Path(scratch) / "state"
        daemon = start_fuzz_daemon(state)
        url = daemon.client().url
        command = [
            str(Path(sys.executable).with_name("schemathesis")),
            "--config-file",
            str(CONFIG_FILE),
            "run",
            f"{url}/openapi.json",
            "--max-examples",
            str(args.max_examples),
            "--workers",
            "1",
        ]
        if args.seed is not None:
            command += ["--seed", str(args.seed)]
        if args.max_time is not None:
            command += ["--max-time", str(args.max_time)]
        try:
            fuzzed = subprocess.run(command, env={**os.environ, TOKEN_VARIABLE: TOKEN})
            answers = answers_by_status(url)
        finally:
            daemon.stop()
        found = tracebacks(daemon)
        for block in found:
            print(block, file=sys.stderr)
        server_errors = sum(n for status, n in answers.items() if status >= 500)
        print(
            f"daemon answered {sum(answers.values()):,} requests, {server_errors} 5xx; by status: "
            f"{dict(sorted(answers.items()))}",
            file=sys.stderr,
        )
        print(
            f"daemon log {daemon.log_path if args.keep else '(removed)'}: "
            f"{len(found)} traceback(s)",
            file=sys.stderr,
        )
        return 1 if fuzzed.returncode or found or server_errors else 0


if __name__ == "__main__":
    sys.exit(main())
