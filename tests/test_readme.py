"""The commands of README.md and docs/, run, so that the documentation and behaviour
cannot drift apart.

Every fenced block whose info string is `sh`, of README.md and then of every page of
docs/ in the order of DOCS (one session: later pages use what earlier ones made), runs
here, line by line, as a user on the daemon's host would type it: README's first
block's `spotbag serve --config
deploy/spotbag.toml` is the daemon the other lines talk to (SPOTBAG_STATE_DIR points at
its state directory, so the CLI finds its URL and token there). Placeholders stand for
what this run made: BAG for the bag `spotbag submit` printed (a bag still running for
`spotbag cancel`), VM for one of its VMs, sbt_… and 1a2b3c4d5e6f for the token and token
id `spotbag accounts token create` printed, LIFETIMES.csv and TRACE.swf for the shipped
data, $T and $URL for the daemon's token and address (also $SPOTBAG_STATE_DIR, which
holds them). Files the lines read (sweep.yaml, bag.yaml) are written here; files they
write (-o, --plot, >) must exist afterwards.

`sh cloud` blocks need a cloud account or a Slurm head node as root and are not run;
`sh make` blocks (the make targets) are checked with `make -n` and pytest's collection.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.cli.client import Client
from controller.traces.reference_data import LIFETIMES, SWF
from tests.conftest import REPO, wait_until, wait_until_ready

README = REPO / "README.md"
# docs/ pages in the order their commands run: each may use what an earlier one made
# (accounts.md creates the account `lab` and submits to it; cost-reports.md reports on it).
DOCS = [
    "bags",
    "web-ui",
    "preemption-models",
    "checkpoints",
    "accounts",
    "notifications",
    "cost-reports",
    "spot-hopping",
    "clouds",
    "slurm",
    "http-api",
    "operations",
    "architecture",
    "design",
]
PAGES = [README, *(REPO / "docs" / f"{name}.md" for name in DOCS)]
KINDS = {"sh", "sh cloud", "sh make"}
# Only the pages about a head node may show commands that need one (run as root there).
HEAD_NODE_PAGES = {"operations.md", "slurm.md"}

# 20 quick jobs, so that BAG-17 exists; ends before `spotbag submit --watch` returns.
SWEEP = """\
name: readme-sweep
account: readme
command: echo point {i}
parameters: {i: {range: [0, 20, 1]}}
resources: {cpus: 1, memory_gb: 0.5}
max_runtime_s: 60
simulation: {runtime_s: 30}
"""
# Submitted with an account token: the account is the token's.
BAG = """\
name: readme-token-bag
command: echo charged to the token's account
resources: {cpus: 1, memory_gb: 0.5}
max_runtime_s: 60
"""
# What `spotbag cancel BAG` and `spotbag preempt VM` act on: a bag still running.
RUNNING = {
    "name": "readme-running",
    "account": "readme",
    "command": "sleep 600",
    "resources": {"cpus": 1, "memory_gb": 0.5},
    "max_runtime_s": 900,
}


@dataclass
class Block:
    kind: str
    page: str  # README.md, docs/slurm.md, ...
    line: int  # of the opening fence in the page
    commands: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def sh_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page whose info string starts with `sh`, with their
    non-empty lines."""
    page = str(path.relative_to(REPO))
    text = path.read_text()
    blocks: list[Block] = []
    current: Block | None = None
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if inside:
                inside, current = False, None
            else:
                inside = True
                info = line[3:].strip()
                if info == "sh" or info.startswith("sh "):
                    current = Block(info, page, number)
                    blocks.append(current)
        elif current is not None and line.strip():
            current.commands.append(line.strip())
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in sh_blocks(page)]


def test_every_page_of_docs_runs_in_a_known_order():
    pages = sorted(path.stem for path in (REPO / "docs").glob("*.md"))
    assert pages == sorted(DOCS), "add a new docs/ page to DOCS, where its commands can run"


def test_every_sh_block_is_of_a_known_kind():
    blocks = all_blocks()
    unknown = [(b.where, b.kind) for b in blocks if b.kind not in KINDS]
    assert not unknown, f"blocks of no known kind (one of {sorted(KINDS)}): {unknown}"
    # The usage and example blocks are run; only a head node's set-up is not.
    readme = [b for b in blocks if b.page == "README.md"]
    assert sum(b.kind == "sh" for b in readme) >= 2
    assert sum(b.kind == "sh" for b in blocks) >= 18
    cloud = [b for b in blocks if b.kind == "sh cloud"]
    assert all(Path(b.page).name in HEAD_NODE_PAGES for b in cloud), [b.where for b in cloud]
    assert len(cloud) <= 4, [b.where for b in cloud]


@pytest.mark.processes
def test_the_make_targets_the_docs_name_exist():
    for block in all_blocks():
        if block.kind != "sh make":
            continue
        for command in block.commands:
            words = command.split("#")[0].split()
            if words[0] == "make":
                done = subprocess.run(
                    ["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True
                )
                assert done.returncode == 0, f"{block.where}: {command}\n{done.stderr}"
            else:
                assert words[0] == ".venv/bin/pytest", command
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "--collect-only", "-q", *words[1:]],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0 and " tests collected" in done.stdout, done.stdout[
                    -2000:
                ]


class Session:
    """The shell a reader of the docs has: a work directory, PATH with `spotbag`, the state
    directory of the daemon the first block starts, and what earlier lines printed."""

    def __init__(self, tmp_path: Path) -> None:
        self.work = tmp_path / "work"
        self.state = tmp_path / "state"
        self.work.mkdir()
        self.state.mkdir(mode=0o700)
        (self.work / "examples").symlink_to(REPO / "examples")
        deploy = self.work / "deploy"
        deploy.mkdir()
        # The shipped file, on a free port (tests run side by side).
        shipped = (REPO / "deploy" / "spotbag.toml").read_text()
        assert "\nport = 8787\n" in shipped
        (deploy / "spotbag.toml").write_text(shipped.replace("\nport = 8787\n", "\nport = 0\n"))
        (self.work / "sweep.yaml").write_text(SWEEP)
        (self.work / "bag.yaml").write_text(BAG)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "spotbag"
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m controller.cli "$@"\n')
        shim.chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
        self.env.update(
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            PYTHONPATH=str(REPO),
            SPOTBAG_STATE_DIR=str(self.state),
            COLUMNS="200",
        )
        self.values = {"LIFETIMES.csv": str(LIFETIMES), "TRACE.swf": str(SWF)}
        self.daemon: subprocess.Popen | None = None

    def concrete(self, command: str) -> str:
        """The line with each placeholder replaced by what this run made."""
        values = dict(self.values)
        if command.startswith("spotbag cancel") or command.startswith("spotbag preempt"):
            values["BAG"] = values["RUNNING_BAG"]
        for placeholder, value in values.items():
            pattern = rf"(?<![\w-]){re.escape(placeholder)}(?![\w.])"
            command = re.sub(pattern, value, command)
        return command

    def serve(self, command: str) -> None:
        """The daemon, in the background (a reader would open a second terminal)."""
        log = (self.state.parent / "daemon.log").open("ab")
        self.daemon = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.work, env=self.env, stdout=log, stderr=log
        )
        log_path = self.state.parent / "daemon.log"
        url = wait_until_ready(
            self.state, self.daemon, lambda: log_path.read_text(errors="replace")
        )
        token = (self.state / "token").read_text().strip()
        self.env.update(URL=url, T=token)
        # A bag that is still running when `spotbag cancel` comes, on a VM to preempt.
        client = Client(url, token, timeout_s=30)
        running = client.submit({**RUNNING, "workdir": str(self.work)})
        self.values["RUNNING_BAG"] = running["id"]

        def running_vm() -> str | None:
            vms = [v for v in client.vms()["vms"] if v["state"] == "running"]
            return vms[0]["id"] if vms else None

        self.values["VM"] = str(wait_until(running_vm, 60, what="a running VM"))

    def run(self, block: Block, command: str, prelude: list[str]) -> str:
        concrete = self.concrete(command)
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", "\n".join(["set -euo pipefail", *prelude, concrete])],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"block at {block.where}: {command}\nran: {concrete}\n"
            f"exit {done.returncode} after {time.monotonic() - started:.1f} s\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
        return done.stdout + done.stderr

    def learn(self, command: str, output: str) -> None:
        """What later lines refer to: the bag submitted, the token issued."""
        if command.startswith("spotbag submit") and "BAG" not in self.values:
            self.values["BAG"] = re.search(r"submitted bag (\w+)", output)[1]  # type: ignore[index]
        if command.startswith("spotbag accounts token create"):
            self.values["1a2b3c4d5e6f"] = re.search(r"token (\w+) for account", output)[1]  # type: ignore[index]
            self.values["sbt_…"] = re.search(r"^(sbt_\S+)$", output, re.M)[1]  # type: ignore[index]

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()


ASSIGNMENT = re.compile(r"^[A-Z_]+=\$\([^)]*\)\s*(#.*)?$")  # P=$(...), not VAR=x cmd
OUTPUTS = re.compile(r"(?:--plot|-o|>)\s+(\S+)")


@pytest.mark.processes
@pytest.mark.integration
def test_every_command_of_the_docs_works_as_written(tmp_path):
    assert shutil.which("bash")
    blocks = [b for b in all_blocks() if b.kind == "sh"]
    session = Session(tmp_path)
    ran: dict[str, int] = {}
    try:
        for block in blocks:
            prelude: list[str] = []  # a block's variables (P=...) hold for its later lines
            for command in block.commands:
                if command.startswith("spotbag serve"):
                    session.serve(command.split("#")[0].strip())
                    continue
                assert session.daemon is not None, "the first sh block starts the daemon"
                output = session.run(block, command, prelude)
                session.learn(command, output)
                if ASSIGNMENT.match(command):
                    prelude.append(session.concrete(command))
                for written in OUTPUTS.findall(command.split("#")[0]):
                    path = session.work / written
                    assert path.is_file() and path.stat().st_size > 0, f"{command}: no {written}"
                ran[block.page] = ran.get(block.page, 0) + 1
        assert ran.get("README.md", 0) >= 20, ran
        assert sum(ran.values()) >= 55, ran
        # What the lines did is there: BAG succeeded, the running bag was cancelled.
        client = Client(session.env["URL"], session.env["T"], timeout_s=30)
        assert client.bag(session.values["BAG"])["state"] == "succeeded"
        assert client.bag(session.values["RUNNING_BAG"])["state"] == "cancelled"
    finally:
        session.stop()
