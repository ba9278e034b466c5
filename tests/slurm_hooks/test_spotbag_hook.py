"""slurm_hooks/spotbag_hook.py as slurmctld runs it: a subprocess with Slurm's hook
environment (and nothing else), talking to a real HTTP receiver on loopback.

Checked: each hook's event is built from its environment and signed so that the
controller's check (controller/slurm/callbacks.py) accepts it; a controller that is
down gets the events spooled (the hook still exits 0) and the next run delivers the
spool first, in order; a broken config never makes the hook fail; the installed sh
wrappers pass on only the partitions spotbag cares for; a pool job's prolog waits
until its node is powered up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from controller.slurm import callbacks
from controller.slurm.hooks_install import HookInstall, install_hooks

pytestmark = pytest.mark.processes  # real processes: left out of make test-fast

SECRET = b"0123456789abcdef0123456789abcdef"


class Receiver:
    """A controller stand-in that records every signed request it gets."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[tuple[dict, dict]] = []  # (headers, body)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append((dict(self.headers), json.loads(body)))
                owner.raw.append(
                    (
                        self.headers.get(callbacks.TIMESTAMP_HEADER),
                        self.headers.get(callbacks.SIGNATURE_HEADER),
                        body,
                    )
                )
                self.send_response(owner.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.raw: list[tuple[str, str, bytes]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


def install(tmp_path: Path, url: str, **changes) -> HookInstall:
    setup = HookInstall(
        dest=tmp_path / "hooks",
        config_path=tmp_path / "etc" / "slurm-hooks.json",
        url=url,
        secret=SECRET,
        spool_dir=tmp_path / "spool",
        pool_partitions=["spot"],
        python=sys.executable,
        **changes,
    )
    install_hooks(setup)
    return setup


def run_hook(
    setup: HookInstall, hook: str, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess:
    # slurmctld runs hooks with an empty environment, then the hook's own variables.
    return subprocess.run(
        [str(setup.dest / hook), *args], env=env, capture_output=True, text=True, timeout=30
    )


JOBCOMP = {
    "JOBID": "42",
    "JOBNAME": "sb:ctl:b0000000001-0.1",
    "JOBSTATE": "COMPLETED",
    "EXITCODE": "0:0",
    "NODES": "sb-vm-1",
    "PARTITION": "spotbag",
    "USERNAME": "root",
    "ACCOUNT": "physics",
    "PROCS": "2",
    "SUBMIT": "1795594091",
    "START": "1795594092",
    "END": "1795594093",
}


def test_events_are_built_from_the_hook_environment_and_signed(tmp_path, receiver):
    setup = install(tmp_path, receiver.url)
    assert run_hook(setup, "jobcomp", JOBCOMP).returncode == 0
    prolog = {
        "SLURM_JOB_ID": "43",
        "SLURM_JOB_NAME": "interactive",
        "SLURM_JOB_RESTART_COUNT": "1",
        "SLURM_JOB_NODELIST": "spot-1",
        "SLURM_JOB_PARTITION": "spot",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_ACCOUNT": "chem",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
    }
    # The prolog of a pool job waits for power-up: a fake sinfo says the node is up.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho idle\n")
    (bin_dir / "sinfo").chmod(0o755)
    setup = install(tmp_path, receiver.url, bin_dir=str(bin_dir))
    assert run_hook(setup, "prolog_slurmctld", prolog).returncode == 0
    resume_file = tmp_path / "resume.json"
    resume_file.write_text(
        json.dumps({"jobs": [{"job_id": 43, "nodes": "spot-1"}], "all_nodes": "spot-1"})
    )
    assert (
        run_hook(setup, "resume", {"SLURM_RESUME_FILE": str(resume_file)}, "spot-[1-2]").returncode
        == 0
    )

    (jobcomp, prolog_event, resume) = [json.loads(raw) for _, _, raw in receiver.raw]
    for timestamp, signed, raw in receiver.raw:
        callbacks.verify(SECRET, timestamp, signed, raw, time.time(), 300)  # accepted
    with pytest.raises(callbacks.CallbackRejected):
        callbacks.verify(
            b"another secret, sixteen+",
            receiver.raw[0][0],
            receiver.raw[0][1],
            receiver.raw[0][2],
            time.time(),
            300,
        )
    event = callbacks.SlurmEvent.model_validate(jobcomp)
    assert (event.event, event.job_id, event.state, event.cpus, event.account) == (
        "jobcomp",
        "42",
        "COMPLETED",
        2.0,
        "physics",
    )
    assert event.key == "sb:ctl:b0000000001-0.1:42:1795594091:1795594093:jobcomp"
    event = callbacks.SlurmEvent.model_validate(prolog_event)
    assert event.key == "interactive:43:1:prolog_slurmctld" and event.user == "alice"
    event = callbacks.SlurmEvent.model_validate(resume)
    assert event.nodes == "spot-[1-2]" and event.resume["all_nodes"] == "spot-1"


def test_a_controller_that_is_down_gets_the_events_later_in_order(tmp_path, receiver):
    down = install(tmp_path, "http://127.0.0.1:9")  # nobody listens there
    for n in range(3):
        result = run_hook(down, "jobcomp", {**JOBCOMP, "JOBID": str(n)})
        assert result.returncode == 0
    spooled = sorted(p.name for p in (tmp_path / "spool").glob("*.json"))
    assert len(spooled) == 3 and not receiver.requests

    up = install(tmp_path, receiver.url)
    assert run_hook(up, "jobcomp", {**JOBCOMP, "JOBID": "3"}).returncode == 0
    assert [body["job_id"] for _, body in receiver.requests] == ["0", "1", "2", "3"]
    assert not list((tmp_path / "spool").glob("*.json"))

    # A controller answering 5xx (or 401: a secret being rotated) keeps them spooled too.
    receiver.status = 503
    assert run_hook(up, "jobcomp", {**JOBCOMP, "JOBID": "4"}).returncode == 0
    assert len(list((tmp_path / "spool").glob("*.json"))) == 1
    receiver.status = 200
    run_hook(up, "jobcomp", {**JOBCOMP, "JOBID": "5"})
    assert [body["job_id"] for _, body in receiver.requests][-2:] == ["4", "5"]


def test_a_hook_never_fails_even_with_a_broken_config(tmp_path):
    setup = install(tmp_path, "http://127.0.0.1:9")
    setup.config_path.write_text("{not json")
    result = run_hook(setup, "prolog_slurmctld", {"SLURM_JOB_PARTITION": "spot"})
    assert result.returncode == 0 and "spotbag hook" in result.stderr
    program = setup.dest / "spotbag_hook.py"
    result = subprocess.run([sys.executable, "-IS", str(program)], capture_output=True, text=True)
    assert result.returncode == 0 and "usage" in result.stderr


def test_wrappers_pass_on_only_spotbags_partitions(tmp_path, receiver):
    setup = install(tmp_path, receiver.url)
    run_hook(setup, "jobcomp", {**JOBCOMP, "PARTITION": "somebody-elses"})
    run_hook(setup, "prolog_slurmctld", {"SLURM_JOB_PARTITION": "spotbag", "SLURM_JOB_ID": "1"})
    run_hook(setup, "epilog_slurmctld", {"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_ID": "1"})
    assert receiver.requests == []
    run_hook(setup, "epilog_slurmctld", {"SLURM_JOB_PARTITION": "spotbag", "SLURM_JOB_ID": "1"})
    assert [body["event"] for _, body in receiver.requests] == ["epilog_slurmctld"]
    assert "spot)" in (setup.dest / "prolog_slurmctld").read_text()
    for name in ("jobcomp", "prolog_slurmctld", "resume", "suspend", "resume_fail"):
        assert os.access(setup.dest / name, os.X_OK)
    assert oct(setup.config_path.stat().st_mode & 0o777) == "0o600"


def test_a_pool_jobs_prolog_waits_until_its_node_is_powered_up(tmp_path, receiver):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    counter = tmp_path / "asked"
    # sinfo says "powering up" three times, then "allocated".
    (bin_dir / "sinfo").write_text(
        f"#!/bin/sh\necho x >> {counter}\n"
        f'if [ "$(wc -l < {counter})" -le 3 ]; then echo "allocated#"; else echo allocated; fi\n'
    )
    (bin_dir / "sinfo").chmod(0o755)
    setup = install(tmp_path, receiver.url, bin_dir=str(bin_dir))
    began = time.monotonic()
    result = run_hook(
        setup,
        "prolog_slurmctld",
        {"SLURM_JOB_PARTITION": "spot", "SLURM_JOB_NODELIST": "spot-0", "SLURM_JOB_ID": "7"},
    )
    assert result.returncode == 0
    assert counter.read_text().count("x") == 4
    assert time.monotonic() - began >= 0.6  # three waits of 0.2 s
    assert receiver.requests[0][1]["event"] == "prolog_slurmctld"


def test_a_signature_or_timestamp_of_raw_bytes_is_refused_not_an_error():
    """Headers of raw non-UTF-8 bytes reach the handler as surrogate escapes: a refusal
    (401), not the TypeError hmac.compare_digest raises for non-ASCII text (a 500)."""
    now = time.time()
    timestamp = str(int(now))
    for stamp, signed in (
        (timestamp, "sha256=\udcff\udcfe"),
        (timestamp, "sha256=" + "é" * 64),
        ("١٧٠٠٠٠٠٠٠٠", "sha256=" + "0" * 64),  # digits, but not ASCII ones
    ):
        with pytest.raises(callbacks.CallbackRejected):
            callbacks.verify(SECRET, stamp, signed, b"{}", now, 300)
