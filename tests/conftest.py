"""Shared fixtures: a real daemon in a subprocess and a client for it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.cli.client import Client

REPO = Path(__file__).resolve().parent.parent

FAST_CONFIG = """
[api]
host = "127.0.0.1"
port = 0
token = "{token}"

[scheduler]
max_vms = {max_vms}
idle_timeout_s = 2.0
poll_interval_s = 0.2

[driver]
name = "local"
boot_delay_s = 0.1
time_scale = {time_scale}
seed = 7

[preemption]
model = "{model}"
mttf_h = {mttf_h}

[executor]
kill_grace_s = 1.0

[hopping]
# Types are chosen by the policy; jobs stay where they start (tests of other features
# count their attempts). tests/integration/test_hopping.py moves jobs.
migrate = false

[[vm_types]]
name = "local-2"
cpus = 2
memory_gb = 4.0
spot_price_per_hour = 0.02
on_demand_price_per_hour = 0.08
zone = "local"

[[vm_types]]
name = "local-4"
cpus = 4
memory_gb = 8.0
spot_price_per_hour = 0.05
on_demand_price_per_hour = 0.17
zone = "local"
"""


# Only a start that hangs fails a wait for readiness: a slow one (a busy machine, a long
# recovery) is waited for as long as its process lives.
START_HANG_S = 600.0


def health_status(url: str) -> str:
    """The `status` of the daemon's GET /healthz at `url` (starting, ok, failing), or ''
    when nothing answers there."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (urllib.error.URLError, OSError):
        return ""
    try:
        return str(json.loads(body).get("status", ""))
    except (ValueError, AttributeError):
        return ""


def wait_until_ready(
    state_dir: Path,
    process: subprocess.Popen,
    log: Callable[[], str],
    hang_s: float = START_HANG_S,
) -> str:
    """The URL of the daemon `process` started on `state_dir`, once it is ready: its
    STATE_DIR/api.url written, then GET /healthz answering status ok (the readiness rule,
    docs/operations.md#healthz). No fixed count of seconds: it waits as long as the process
    lives (`hang_s` only ends a start that hangs); a process that exits fails the wait with
    its exit status and `log()`."""
    url_file = state_dir / "api.url"
    deadline = time.monotonic() + hang_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"the daemon exited with status {process.returncode} before it was ready; "
                f"its log:\n{log()}"
            )
        url = url_file.read_text().strip() if url_file.exists() else ""
        if url and health_status(url) == "ok":
            return url
        if time.monotonic() > deadline:
            raise RuntimeError(f"the daemon was not ready after {hang_s:g} s; its log:\n{log()}")
        time.sleep(0.05)


# The daemons the running test made (for the Slurm tests' failure report, below).
DAEMONS_OF_THE_TEST: list[Daemon] = []


class Daemon:
    """A `spotbag serve` subprocess on a state directory that outlives restarts."""

    def __init__(self, state_dir: Path, config_path: Path, token: str) -> None:
        DAEMONS_OF_THE_TEST.append(self)
        self.state_dir = state_dir
        self.config_path = config_path
        self.token = token
        self.process: subprocess.Popen | None = None
        self.log_path = state_dir / "daemon.log"
        # Its controller id once it has run (the prefix of its VM hosts' names): kept
        # here, as its state directory may be gone before its VM hosts are removed.
        self.controller_id: str | None = None

    def start(
        self,
        hang_s: float = START_HANG_S,
        extra_env: dict[str, str] | None = None,
        nofile: int | None = None,
    ) -> Client:
        """Start the daemon and wait until it is ready (`wait_until_ready`)."""
        process = self.launch(extra_env, nofile)
        wait_until_ready(self.state_dir, process, self.log, hang_s)
        self.controller_id = self.controller_id or controller_id_of(self.state_dir)
        return self.client()

    def launch(
        self, extra_env: dict[str, str] | None = None, nofile: int | None = None
    ) -> subprocess.Popen:
        """Start the daemon's process, without waiting; `nofile` runs it with that many
        descriptors at most (soft and hard RLIMIT_NOFILE, as `ulimit -n` or systemd's
        LimitNOFILE= would)."""
        url_file = self.state_dir / "api.url"
        url_file.unlink(missing_ok=True)
        log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
        env.update(extra_env or {})
        # util-linux's prlimit sets the limit before exec: no preexec_fn in a test
        # process that may have threads.
        limit = ["prlimit", f"--nofile={nofile}:{nofile}", "--"] if nofile else []
        self.process = subprocess.Popen(
            [
                *limit,
                sys.executable,
                "-m",
                "controller.cli",
                "--state-dir",
                str(self.state_dir),
                "serve",
                "--config",
                str(self.config_path),
                "--log-level",
                "debug",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )
        return self.process

    def client(self, token: str | None = None) -> Client:
        url = (self.state_dir / "api.url").read_text().strip()
        return Client(url, self.token if token is None else token, timeout_s=30)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def make_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Build daemons: make_daemon(model="exponential", mttf_h=..., time_scale=..., max_vms=...,
    base=where its state directory goes, tmp_path by default)."""
    daemons: list[Daemon] = []

    def make(
        *,
        model: str = "none",
        mttf_h: float = 24.0,
        time_scale: float = 1.0,
        max_vms: int = 4,
        token: str = "test-token",
        base: Path | None = None,
    ) -> Daemon:
        state_dir = (base or tmp_path) / f"state{len(daemons)}"
        state_dir.mkdir()
        config_path = state_dir / "spotbag.toml"
        config_path.write_text(
            FAST_CONFIG.format(
                token=token, model=model, mttf_h=mttf_h, time_scale=time_scale, max_vms=max_vms
            )
        )
        daemon = Daemon(state_dir, config_path, token)
        daemons.append(daemon)
        return daemon

    yield make
    for daemon in daemons:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
        halt_vm_hosts(daemon.controller_id or controller_id_of(daemon.state_dir))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A Slurm test that fails reports what the cluster and its daemons said then: a
    wait that timed out says only what it waited for, and a failure seen once in a full
    CI run may not come back alone."""
    report = yield
    if report.failed and call.when == "call" and "slurm_cluster" in item.fixturenames:
        cluster = item.funcargs.get("slurm_cluster")
        for title, text in slurm_failure_sections(cluster):
            report.sections.append((f"at the failure: {title}", text))
    if call.when == "teardown":
        DAEMONS_OF_THE_TEST.clear()
    return report


def slurm_failure_sections(cluster) -> list[tuple[str, str]]:
    """squeue, the nodes' states and reasons, slurmctld's log and each daemon's, tails."""
    sections = []
    if cluster is not None:
        exited = cluster.slurmctld_exit()
        sections.append(("slurmctld", "running" if exited is None else exit_status(exited)))
        for title, argv in (
            ("squeue", ("squeue", "-a", "-o", "%i %u %a %P %T %r %N %S %e")),
            ("sinfo", ("sinfo", "-N", "-o", "%N %T %E %H")),
        ):
            try:
                sections.append((title, cluster.run(*argv, check=False, timeout=10)))
            except subprocess.TimeoutExpired:
                sections.append((title, "(timed out)"))
        sections.append(("slurmctld.log", tail_of(cluster.base / "log" / "slurmctld.log", 120)))
        sections.extend(vm_host_slurmd_logs())
    for daemon in DAEMONS_OF_THE_TEST:
        sections.append((f"{daemon.log_path}", tail_of(daemon.log_path, 150)))
    return sections


def vm_host_slurmd_logs() -> list[tuple[str, str]]:
    """The slurmd log of each VM host still up (its /var/log is its own tmpfs: read in
    its slurmd's mount namespace): when its node registered, or why it did not."""
    found = subprocess.run(["pgrep", "-a", "slurmd"], capture_output=True, text=True).stdout
    sections = []
    for line in found.splitlines()[:8]:
        pid, _, argv = line.partition(" ")
        try:
            text = subprocess.run(
                ["nsenter", "-t", pid, "-m", "tail", "-n", "40", "/var/log/slurm/slurmd.log"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            continue
        sections.append((f"slurmd {argv}", text.stdout or text.stderr))
    return sections


def exit_status(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def tail_of(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"({error})"


@pytest.fixture(autouse=True)
def no_vm_host_outlives_its_test(request) -> Iterator[None]:
    """After a test on the Slurm cluster (and its daemons' teardown: this fixture is set
    up first, so torn down last), no VM host it made is left on the cluster's bridge: one
    left would answer for the addresses the next tests' VMs get. Any found is removed,
    with a warning naming the test (a teardown that missed it is a test defect)."""
    if "slurm_cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("slurm_cluster")
    exited = cluster.slurmctld_exit()
    if exited is not None:
        # It died during an earlier test (that test failed, its report says so): start it
        # again on its saved state, so that one crash fails one test, not all after it.
        cluster.start_slurmctld()
        warnings.warn(
            f"slurmctld had exited ({exit_status(exited)}) before {request.node.nodeid}: "
            "started again",
            stacklevel=1,
        )
    before = cluster.vm_hosts()
    yield
    left = cluster.vm_hosts() - before
    if left:
        cluster.halt_hosts(left)
        warnings.warn(
            f"{request.node.nodeid} left VM hosts {sorted(left)} on the bridge (removed)",
            stacklevel=1,
        )


def controller_id_of(state_dir: Path) -> str | None:
    """The controller id a daemon's store keeps (None: it never ran there)."""
    import sqlite3

    db = state_dir / "spotbag.db"
    if not db.exists():
        return None
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'controller_id'").fetchone()
        except sqlite3.OperationalError:  # no meta table yet
            return None
    return row[0] if row else None


def halt_vm_hosts(controller_id: str | None) -> int:
    """Remove the VM hosts (network namespaces) a daemon's local driver left running: a
    stopped daemon's VMs outlive it (its restart adopts them), and on a bridge that the
    next test's daemon shares they would hold the addresses it hands out (two hosts
    answering ARP for one address: its nodes' traffic goes astray, and its jobs run on
    another test's VM). As an operator retiring a daemon would, with the driver's own
    NamespaceHosts.halt_all, by the names' prefix: the daemon's state directory may be
    gone already (a fixture that made it was torn down first)."""
    import asyncio

    from drivers.local_hosts import NamespaceHosts

    if controller_id is None or not shutil.which("ip"):
        return 0  # it never ran, or no iproute2 (no VM host could be made)
    hosts = NamespaceHosts(
        bridge="unused",
        subnet="10.255.255.0/24",
        consoles=Path(tempfile.gettempdir()),  # not used by halt_all
        prefix=f"sb{controller_id[:8]}-",  # controller/wiring.py's
    )
    return asyncio.run(hosts.halt_all())


@pytest.fixture
def passable_dir() -> Iterator[Path]:
    """A directory other users may pass through (0711), with its parents, for a daemon
    whose jobs run as other users (`make_daemon(base=...)`). Not under pytest's own
    temporary directories: each pytest session (xdist's workers, a suite run beside
    this one) makes their common parent private again, 0700, whenever it starts."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = 60.0,
    interval_s: float = 0.1,
    what: str = "condition",
) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# `spotbag ARGS` in a fresh interpreter that writes, as it exits, the modules it held.
CLI_RECORDING_MODULES = """
import atexit, json, sys
out, sys.argv = sys.argv[1], ["spotbag", *sys.argv[2:]]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from controller.cli import main
main()
"""


def run_cli_recording_modules(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `spotbag ARGS`; its result, and every module it imported (sys.modules at exit:
    `python -X importtime` leaves out modules loaded by importlib, as the CLI's are)."""
    out = tmp_path / f"modules-{time.monotonic_ns()}.json"
    done = subprocess.run(
        [sys.executable, "-c", CLI_RECORDING_MODULES, str(out), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    return done, set(json.loads(out.read_text()))


def wait_for_bag(client: Client, bag_id: str, timeout_s: float = 90.0) -> dict:
    def finished() -> dict | None:
        bag = client.bag(bag_id)
        return bag if bag["state"] != "active" else None

    return wait_until(finished, timeout_s, 0.2, f"bag {bag_id} to finish")  # type: ignore[return-value]


# --- a real Slurm cluster (tests/slurm_cluster.py) ---------------------------------


def require_slurm() -> None:
    """Skip when this machine cannot run Slurm; under CI (CI=true) that is a failure:
    .ci/run installs it."""
    from tests.slurm_cluster import missing

    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Slurm tests, but: {reason}")
    pytest.skip(reason)


# The pool the session's cluster declares, as the daemons that serve it configure it
# (tests/integration/test_slurm_power_saving.py POOL): slurm.conf is rendered from it.
# make_slurm_daemon checks that a daemon's config renders the same fragment.
SLURM_POOL = """
[[slurm.pools]]
partition = "spot"
nodes = "spot-[0-3]"
vm_types = ["local-2"]
suspend_time_s = 5
"""


@pytest.fixture(scope="session")
def slurm_cluster():
    """One cluster for the session: spotbag's dynamic-node partition and a power-saving
    pool "spot" of four 2-CPU CLOUD nodes, whose idle VMs are ended 5 s after their
    jobs (suspend_time_s) so that a test sees that happen."""
    require_slurm()
    from tests.slurm_cluster import SlurmCluster

    cluster = SlurmCluster(spotbag_config=SLURM_POOL).start()
    yield cluster
    cluster.stop()


SLURM_DRIVER = """hosts = "netns"
host_bridge = "{bridge}"
host_subnet = "{subnet}"
"""
SLURM_CONFIG = """
[executor]
name = "slurm"
kill_grace_s = 1.0

[slurm]
slurm_conf = "{conf}"
munge_key = "file:{munge_key}"
munge_socket = "{munge_socket}"
shared_dir = "{shared}"
hook_secret_file = "{secret}"
poll_interval_s = 0.5
file_poll_s = 0.1
pending_timeout_s = 30.0
"""


@pytest.fixture
def make_slurm_daemon(make_daemon, slurm_cluster):
    """Daemons whose VMs are VM hosts that join `slurm_cluster` and run the jobs; the
    cluster's hooks call the last one started back."""

    def make(**kwargs) -> Daemon:
        daemon = make_daemon(**kwargs)
        secret = daemon.state_dir / "slurm-hook.secret"
        secret.write_bytes(slurm_cluster.hook_secret + b"\n")
        secret.chmod(0o600)
        shared = daemon.state_dir.parent / f"shared-{daemon.state_dir.name}"
        text = daemon.config_path.read_text()
        text = text.replace("\n[executor]\nkill_grace_s = 1.0\n", "\n")
        text = text.replace(
            "[driver]\n",
            "[driver]\n"
            + SLURM_DRIVER.format(bridge=slurm_cluster.bridge, subnet=slurm_cluster.subnet),
            1,
        )
        daemon.config_path.write_text(
            text
            + SLURM_CONFIG.format(
                conf=slurm_cluster.conf,
                munge_key=slurm_cluster.munge_key,
                munge_socket=slurm_cluster.munge_socket,
                shared=shared,
                secret=secret,
            )
        )
        original_start = daemon.start

        def start(*args, **kw):
            same_conf_as(slurm_cluster, daemon.config_path)
            client = original_start(*args, **kw)
            slurm_cluster.point_hooks(client.url)
            return client

        daemon.start = start  # type: ignore[method-assign]
        return daemon

    return make


def same_conf_as(cluster, config_path: Path) -> None:
    """A daemon's config must render the cluster's slurm.conf fragment (`spotbag slurm
    conf`), or the test would run a cluster its users could not have: with the same
    pools when it serves them, else the same apart from the pools."""
    from controller.config import load_config
    from controller.slurm.setup import fragment_for

    config = load_config(config_path)
    if not config.slurm.pools:
        slurm = cluster.config.slurm.model_copy(update={"pools": ()})
        expected = fragment_for(
            cluster.config.model_copy(update={"slurm": slurm}), str(cluster.hooks_dir)
        )
    else:
        expected = cluster.fragment
    assert fragment_for(config, str(cluster.hooks_dir)) == expected, (
        f"{config_path} does not render the test cluster's slurm.conf fragment: "
        "its [slurm] or [[slurm.pools]] differ from tests/conftest.py SLURM_POOL"
    )


# --- Slurm users' jobs on the pool ----------------------------------------------------

# The pool as the daemons that serve it configure it (SLURM_POOL, what the cluster
# declares, with what only the daemon reads: a job without a time limit reserves its
# CPUs for 2 hours).
POOL = SLURM_POOL + "reserve_hours = 2.0\n"
# A second plain user, with no spotbag account unless a test gives it one. Made when
# absent (and left: tests beside this one may be using it).
OTHER_USER = "spotbag-pool-user"


def plain_user(name: str = OTHER_USER) -> str:
    """A plain Unix user (no home, no login shell, a group of its own), made if absent
    (and left: tests beside this one may be using it)."""
    if subprocess.run(["id", "-u", name], capture_output=True).returncode == 0:
        return name
    made = subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
    )
    if made.returncode not in (0, 9):  # 9: made meanwhile by a test beside this one
        raise RuntimeError(f"useradd {name}: {made.stderr.strip()}")
    return name


SAY_HOST = "echo host=$(hostname)"


@pytest.fixture
def pool_daemons(make_slurm_daemon, slurm_cluster) -> Iterator[Callable[..., Daemon]]:
    """Daemons with the pool "spot": make(slurm='lines for [slurm]\n', pool='lines for
    the pool\n', **make_slurm_daemon's). Each test leaves the pool as it found it: its
    jobs cancelled and every pool VM released through Slurm's own power-down while the
    daemon still runs. Pool nodes have fixed names, so a VM left behind (its daemon
    killed, its slurmd still up) would register as the node the next test resumes, and
    run that test's job."""
    made: list[Daemon] = []

    def make(*, slurm: str = "", pool: str = "", **kwargs) -> Daemon:
        daemon = make_slurm_daemon(**kwargs)
        text = daemon.config_path.read_text()
        if slurm:
            assert "\n[slurm]\n" in text
            text = text.replace("\n[slurm]\n", f"\n[slurm]\n{slurm}", 1)
        daemon.config_path.write_text(text + POOL + pool)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        if daemon.process is None or daemon.process.poll() is not None:
            continue
        exited = slurm_cluster.slurmctld_exit()
        if exited is not None:  # nothing can power the pool down (its test's report says so)
            raise AssertionError(f"slurmctld exited during the test ({exit_status(exited)})")
        slurm_cluster.run("scancel", "-p", "spot", check=False)
        client = daemon.client()
        wait_until(
            lambda: not pool_vms_alive(client),  # noqa: B023 (called before the next loop)
            120,
            0.5,
            "the pool's VMs to be released after the test",
        )


def pool_vms_alive(client: Client) -> list[dict]:
    return [v for v in client.vms()["vms"] if v["pool_node"]]


# --- the fast tier (`make test-fast`) ----------------------------------------------------
# Unit and policy tests only: no daemon, no Slurm, no process of any kind. Tests that
# start processes carry the `processes` marker (whole modules by pytestmark); in the
# fast tier an unmarked test that starts one fails, so the tier stays what it says.
FAST_TIER = os.environ.get("SPOTBAG_FAST_TIER") == "1"
# ...nor imports the mocked clouds' test modules (marker clouds): google-cloud-compute and
# moto alone take 3 s of CPU in each worker.
collect_ignore = ["drivers/test_aws_driver.py", "drivers/test_gce_driver.py"] if FAST_TIER else []


@pytest.fixture(autouse=FAST_TIER)
def _no_processes_in_the_fast_tier(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(
            "this test starts a process: mark it @pytest.mark.processes (the fast tier "
            "runs no processes)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under `--dist loadgroup`, a Slurm test whose id lacks its group ("@slurm", how
    xdist's scheduler sees the group) fails before its cluster starts: the grouping has
    failed silently before (the mark added after xdist read the marks; pytest 9.2
    ignores the id xdist rewrites, pytest-dev/pytest-xdist#1386), and two workers then
    ran two clusters at once."""
    if (
        getattr(item.config.option, "loadgroup", False)
        and item.get_closest_marker("slurm") is not None
        and not item.nodeid.endswith("@slurm")
    ):
        pytest.fail(
            "--dist loadgroup does not group the Slurm tests (no @slurm in the test's id): "
            "check the pytest and pytest-xdist versions (pyproject.toml)",
            pytrace=False,
        )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests on a real Slurm cluster run one at a time, on one xdist worker (`make test`
    passes `--dist loadgroup`): two clusters, their VM hosts and daemons at once on a
    2-CPU host made VM boots, job launches and notices take 5-10 times their time alone,
    past what the tests allow. One cluster per session also starts once, not twice.
    First among the hooks: pytest-xdist reads the group marks in its own
    pytest_collection_modifyitems, and one added after it groups nothing
    (`pytest_runtest_setup` fails a Slurm test it did not group).

    In the fast tier, property tests try a fifth of their examples (at least 10):
    the tier is the edit-test loop, `make test` runs every example."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if not FAST_TIER:
        return
    from hypothesis import settings

    machines = {
        item.cls for item in items if isinstance(getattr(item.cls, "settings", None), settings)
    }
    for machine in machines:  # rule-based state machines (their TestCase's settings)
        chosen = machine.settings
        machine.settings = settings(chosen, max_examples=max(10, chosen.max_examples // 5))
    for item in items:
        test = getattr(item, "obj", None)
        chosen = getattr(test, "_hypothesis_internal_use_settings", None)
        if chosen is None:
            continue
        fewer = max(10, chosen.max_examples // 5)
        if fewer < chosen.max_examples:
            test._hypothesis_internal_use_settings = settings(chosen, max_examples=fewer)
