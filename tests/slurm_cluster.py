"""A real Slurm cluster for tests and benchmarks: munged and slurmctld on this host,
VMs as network-namespace hosts (drivers/local_hosts.py) that join it.

Its slurm.conf is what a site runs: spotbag's fragment exactly as `spotbag slurm
conf` prints it (controller/slurm/setup.py `fragment_for`) for a spotbag config like
the tests' daemons use (`spotbag_config`, e.g. their [[slurm.pools]]), after a base
of what a one-host test needs and a site would have anyway: names, ports, paths,
plugins that run without systemd or cgroups. Nothing in the base changes a behaviour
spotbag relies on; whatever does belongs in the fragment, so that users get it too.
The hooks are installed with the settings `spotbag slurm install-hooks` derives from
the same config.

Follows the project's Slurm notes (SLURM.md of the development machines): a fresh
directory under /tmp (mode 0711, for munge), a free port, slurmctld in the
foreground, and a bridge whose first address is the head node's, where configless
slurmds in the VM hosts fetch their configuration. Ready in well under a second;
`stop()` cancels every job, halts the VM hosts and removes everything.

Needs root, Slurm 22.05's slurmctld, slurmd and clients, munge and iproute2.
`missing()` says what is not there; tests skip on that, except under CI=true, where
it is a failure (.ci/run installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controller.config import load_config
from controller.slurm.hooks_install import install_hooks
from controller.slurm.pools import PoolBook
from controller.slurm.setup import fragment_for, hook_install_for

TOOLS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged", "ip", "nsenter")

# What a cluster on one test host needs besides spotbag's fragment, each for a reason of
# this host; Slurm's defaults for the rest (munge for authentication, no accounting).
BASE_CONF = """\
# ---- one test host (tests/slurm_cluster.py) ---------------------------------
ClusterName={cluster}
# The head node's address on the cluster's own bridge, where the VM hosts reach it,
# and a free port: several test sessions may share this host.
SlurmctldHost={hostname}({head})
SlurmctldPort={port}
# Everything runs as root here; a site runs slurmctld as its SlurmUser.
SlurmUser=root
SlurmdUser=root
# slurmctld's files in the cluster's own directory; each VM host has its own /var
# and /run for slurmd's.
StateSaveLocation={base}/state
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdSpoolDir=/var/spool/slurmd
SlurmdPidFile=/run/slurmd.pid
SlurmdLogFile=/var/log/slurm/slurmd.log
# No systemd and no cgroups on the test host.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# The VM hosts share this host's 2 cores: trust the CPUs a node declares (a real
# VM has what its node declares, and its boot script declares no more memory).
SlurmdParameters=config_overrides
"""

# The spotbag config the cluster's fragment and hooks are rendered from: what every test
# daemon's config says about this cluster (tests/conftest.py SLURM_CONFIG), plus the
# cluster's `spotbag_config`. The AuthInfo line of the fragment then names this host's
# munge socket (munge_socket), so it needs no merging by hand.
SPOTBAG_CONFIG = """\
[executor]
name = "slurm"

[slurm]
slurm_conf = "{conf}"
munge_socket = "{munge_socket}"
"""


def missing() -> str | None:
    """Why a Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd, munged and network namespaces)"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurmctld slurmd slurm-client munge iproute2)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        candidate = ipaddress.ip_network(
            f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.0/24"
        )
        if (
            f" {next(candidate.hosts())}/" not in used
            and str(candidate.network_address)[:-2] not in used
        ):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 subnet for the test cluster's bridge")


class SlurmCluster:
    """munged + slurmctld on a bridge of its own; VM hosts join as nodes.

    `spotbag_config`: TOML added to the cluster's spotbag config (SPOTBAG_CONFIG), such
    as the [[slurm.pools]] its daemons serve; the fragment in slurm.conf is rendered
    from it. `extra_conf`: lines after the fragment, for capacity only (a benchmark's
    MaxJobCount), never for behaviour: that comes from the fragment."""

    def __init__(
        self,
        *,
        spotbag_config: str = "",
        hooks_dir: Path | None = None,
        extra_conf: str = "",
    ) -> None:
        self.base = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-slurm-"))
        self.base.chmod(0o711)
        self.hooks_dir = hooks_dir or self.base / "hooks"
        self.extra_conf = extra_conf
        self.port = _free_port()
        self.subnet = _free_subnet()
        self.head = str(next(self.subnet.hosts()))
        self.bridge = f"sbbr{secrets.token_hex(3)}"
        self.cluster = "spotbag" + secrets.token_hex(2)
        self.munge_dir = self.base / "munge"
        self.munge_socket = self.munge_dir / "munge.socket"
        # The key apart from the socket's directory, which each VM host has its own of.
        self.munge_key = self.base / "munge-key" / "munge.key"
        self.conf = self.base / "etc" / "slurm.conf"
        self.hook_config = self.base / "etc" / "slurm-hooks.json"
        self.hook_secret = secrets.token_hex(16).encode()
        self.spool_dir = self.base / "spool"
        self._processes: list[subprocess.Popen] = []
        self.spotbag_config = self.base / "etc" / "spotbag.toml"
        self.spotbag_config.parent.mkdir()
        self.spotbag_config.write_text(
            SPOTBAG_CONFIG.format(conf=self.conf, munge_socket=self.munge_socket) + spotbag_config
        )
        self.config = load_config(self.spotbag_config)
        self.pools = PoolBook(self.config.slurm.pools, self.config.catalog()).pools
        # Exactly what `spotbag slurm conf --config ... --hooks-dir ...` prints.
        self.fragment = fragment_for(self.config, str(self.hooks_dir))

    # --- what clients need -----------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def conf_server(self) -> str:
        return f"{self.head}:{self.port}"

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
        return result.stdout

    def point_hooks(self, url: str, secret: bytes | None = None, **changes) -> None:
        """(Re)install the hooks calling `url` back (they read their config per run),
        with what `spotbag slurm install-hooks` derives from the cluster's config."""
        if secret is not None:
            self.hook_secret = secret
        install = hook_install_for(
            self.config,
            dest=self.hooks_dir,
            config_path=self.hook_config,
            url=url,
            secret=self.hook_secret,
            spool_dir=self.spool_dir,
            python=sys.executable,  # the hook needs only the standard library
        )
        install_hooks(dataclasses.replace(install, **changes))

    # --- life ----------------------------------------------------------------------------

    def start(self, timeout_s: float = 20.0) -> SlurmCluster:
        for sub in ("state", "run", "log"):
            (self.base / sub).mkdir(exist_ok=True)
        self.munge_dir.mkdir(mode=0o711, exist_ok=True)
        self.munge_dir.chmod(0o711)
        self.munge_key.parent.mkdir(mode=0o700, exist_ok=True)
        self.munge_key.write_bytes(os.urandom(1024))
        self.munge_key.chmod(0o600)
        self.point_hooks("http://127.0.0.1:9")  # nobody there yet: events are spooled
        self._bridge_up()
        self.conf.write_text(
            BASE_CONF.format(
                cluster=self.cluster,
                hostname=socket.gethostname().split(".")[0],
                head=self.head,
                port=self.port,
                base=self.base,
            )
            + "\n"
            + self.fragment
            + self.extra_conf
        )
        self._spawn(
            "munged",
            "-F",
            f"--socket={self.munge_socket}",
            f"--key-file={self.munge_key}",
            f"--log-file={self.base}/log/munged.log",
            f"--pid-file={self.munge_dir}/munged.pid",
            f"--seed-file={self.munge_dir}/munged.seed",
        )
        deadline = time.monotonic() + timeout_s
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not start")
            time.sleep(0.02)
        self._spawn("slurmctld", "-D", "-i", log=self.base / "log" / "slurmctld.out")
        while "is UP" not in self.run("scontrol", "ping", check=False):
            if time.monotonic() > deadline:
                logs = [self.base / "log" / name for name in ("slurmctld.out", "slurmctld.log")]
                said = "".join(log.read_text()[-3000:] for log in logs if log.exists())
                self.stop()  # removes the logs: read first
                raise RuntimeError(f"slurmctld did not answer:\n{said}")
            time.sleep(0.05)
        return self

    def _spawn(self, *argv: str, log: Path | None = None) -> None:
        out = (log or self.base / "log" / f"{argv[0]}.out").open("ab")
        self._processes.append(
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        )
        out.close()

    def _bridge_up(self) -> None:
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(
            ["ip", "addr", "add", f"{self.head}/{self.subnet.prefixlen}", "dev", self.bridge],
            check=True,
        )
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    def hosts(self, consoles: Path, prefix: str | None = None):
        """VM hosts on this cluster's bridge (drivers/local_hosts.py)."""
        from drivers.local_hosts import PRIVATE_DIRS, NamespaceHosts

        return NamespaceHosts(
            bridge=self.bridge,
            subnet=str(self.subnet),
            consoles=consoles,
            prefix=prefix or f"sbt{secrets.token_hex(3)}-",
            private_dirs=(*PRIVATE_DIRS, str(self.munge_dir)),
        )

    def restart_slurmctld(self) -> None:
        """Stop slurmctld and start it again on its saved state (jobs survive)."""
        ctld = self._processes[1]
        ctld.send_signal(signal.SIGTERM)
        ctld.wait(20)
        self._processes.remove(ctld)
        self._spawn("slurmctld", "-D", log=self.base / "log" / "slurmctld.out")
        self._processes.insert(1, self._processes.pop())
        deadline = time.monotonic() + 20
        while "is UP" not in self.run("scontrol", "ping", check=False):
            if time.monotonic() > deadline:
                raise RuntimeError("slurmctld did not come back")
            time.sleep(0.05)

    def slurmctld_exit(self) -> int | None:
        """slurmctld's exit status if it has exited (a negative number: the signal that
        ended it; Slurm 22.05.8's has been seen to die of SIGSEGV in its power-save
        thread), else None."""
        return self._processes[1].poll()

    def stop_slurmctld(self) -> None:
        ctld = self._processes[1]
        ctld.send_signal(signal.SIGTERM)
        ctld.wait(20)

    def start_slurmctld(self) -> None:
        """After stop_slurmctld: start it on its saved state."""
        self._processes.pop(1)
        self._spawn("slurmctld", "-D", log=self.base / "log" / "slurmctld.out")
        self._processes.insert(1, self._processes.pop())
        deadline = time.monotonic() + 20
        while "is UP" not in self.run("scontrol", "ping", check=False):
            if time.monotonic() > deadline:
                raise RuntimeError("slurmctld did not come back")
            time.sleep(0.05)

    def vm_hosts(self) -> set[str]:
        """The network namespaces of the VM hosts on this cluster's bridge."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(
            ["ip", "-o", "link", "show", "master", self.bridge], capture_output=True, text=True
        ).stdout
        found = set()
        for namespace in (line.split()[0] for line in listed.splitlines() if line.strip()):
            peer = subprocess.run(
                ["ip", "-n", namespace, "-o", "link", "show", "eth0"],
                capture_output=True,
                text=True,
            ).stdout
            # A namespace whose eth0 is the peer of a veth on our bridge is one of ours.
            index = peer.split("@if")[-1].split(":")[0] if "@if" in peer else ""
            if index and f"\n{index}: " in "\n" + links:
                found.add(namespace)
        return found

    def halt_hosts(self, namespaces: set[str]) -> None:
        for namespace in namespaces:
            _halt_namespace(namespace)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root", check=False, timeout=10)
        # Every VM host on the bridge: their namespaces hold slurmd, slurmstepd and jobs.
        self.halt_hosts(self.vm_hosts())
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        if os.environ.get("KEEP_SLURM_LOGS"):  # where to keep slurmctld's log, to debug a run
            shutil.copytree(self.base / "log", os.environ["KEEP_SLURM_LOGS"], dirs_exist_ok=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _halt_namespace(namespace: str) -> None:
    for _ in range(50):
        pids = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True
        ).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.02)
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def async_wait_for(
    predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = ""
):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or 'condition'}")
