"""The no-500 promise, held by a fuzzer: schemathesis generates requests for every
operation of the live daemon's own /openapi.json (valid ones, boundary values and
invalid ones) and checks every answer against the document: no 5xx, only documented
statuses, bodies and headers as documented, bad input refused, 405 with Allow.

A bounded, deterministic run (derandomized, no example database, a few examples per
operation and phase: well under a minute); `make fuzz` (tests/fuzz_api.py) runs a
longer one with the same daemon and checks (tests/integration/schemathesis.toml).

The daemon is set up so that fuzzed bags cost nothing: new accounts start with no
CPU-hours (a bag is refused with 402 or held), bags have at most 1000 jobs, and the
jobs that do run (an account the fuzzer created unlimited) find no programs on PATH.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events

from tests.conftest import FAST_CONFIG, Daemon

pytestmark = pytest.mark.integration

CONFIG_FILE = Path(__file__).with_name("schemathesis.toml")
TOKEN = "fuzz-admin-token"
TOKEN_VARIABLE = "SPOTBAG_FUZZ_TOKEN"
EXAMPLES = 50  # per operation and phase; make fuzz runs many more


def start_fuzz_daemon(state_dir: Path) -> Daemon:
    """A daemon whose fuzzed bags cost nothing (see the module's docstring)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    config = FAST_CONFIG.format(
        token=TOKEN, model="none", mttf_h=24.0, time_scale=1.0, max_vms=1
    ).replace(f'token = "{TOKEN}"\n', f'token = "{TOKEN}"\nmax_jobs_per_bag = 1000\n', 1)
    config += '\n[ledger]\nnew_accounts = "credit"\nnew_account_cpu_h = 0.0\n'
    (state_dir / "spotbag.toml").write_text(config)
    daemon = Daemon(state_dir, state_dir / "spotbag.toml", TOKEN)
    empty = state_dir / "no-programs"
    empty.mkdir(exist_ok=True)
    daemon.start(extra_env={"PATH": str(empty)})
    return daemon


def tracebacks(daemon: Daemon) -> list[str]:
    """The log records of the daemon that carry a traceback."""
    return [
        block for block in re.split(r"\n(?=\d{4}-\d\d-\d\d )", daemon.log()) if "Traceback" in block
    ]


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory) -> Iterator[Daemon]:
    daemon = start_fuzz_daemon(tmp_path_factory.mktemp("fuzz"))
    yield daemon
    daemon.stop()


@dataclass
class FuzzRun:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # "operation: check (status)"
    errors: list[str] = field(default_factory=list)  # the fuzzer's own troubles

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def fuzz(url: str, token: str, max_examples: int) -> FuzzRun:
    """Run schemathesis (every phase but stateful) against the daemon at `url` with the
    checks of schemathesis.toml; what it sent and what it found."""
    settings = tomllib.loads(CONFIG_FILE.read_text())
    settings["generation"]["max-examples"] = max_examples
    settings["generation"]["deterministic"] = True  # the same cases every run: no flakes
    settings["phases"] = {"stateful": {"enabled": False}}
    settings["workers"] = 1
    previous = os.environ.get(TOKEN_VARIABLE)
    os.environ[TOKEN_VARIABLE] = token  # the config's ${SPOTBAG_FUZZ_TOKEN}
    try:
        config = SchemathesisConfig.from_dict(settings)
    finally:
        if previous is None:
            os.environ.pop(TOKEN_VARIABLE)
        else:
            os.environ[TOKEN_VARIABLE] = previous
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)
    run = FuzzRun()
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for interaction in recorder.interactions.values():
                run.requests += 1
                if interaction.response is not None:
                    run.statuses[interaction.response.status_code] += 1
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.status == Status.FAILURE:
                        interaction = recorder.interactions.get(case_id)
                        status = interaction.response.status_code if interaction else None
                        info = check.failure_info
                        title = info.failure.title if info is not None else ""
                        run.failures.append(f"{recorder.label}: {check.name} ({status}) {title}")
        elif isinstance(event, events.NonFatalError | events.FatalError):
            run.errors.append(str(getattr(event, "value", None) or event.exception))
    return run


def test_the_api_answers_what_its_openapi_document_says_and_never_5xx(fuzz_daemon):
    run = fuzz(fuzz_daemon.client().url, TOKEN, EXAMPLES)
    print(
        f"\nschemathesis: {run.requests} requests, {run.server_errors} 5xx, "
        f"statuses {dict(sorted(run.statuses.items()))}"
    )
    assert run.requests > 500  # it did reach every operation
    assert run.errors == []
    assert run.server_errors == 0
    assert sorted(set(run.failures)) == [], "\n".join(sorted(set(run.failures)))
    # A handler that failed yet answered a documented 4xx would not show above.
    assert tracebacks(fuzz_daemon) == []
