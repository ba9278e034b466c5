"""A real Slurm cluster for tests and benchmarks: munged and slurmctld on this host,
VMs as network-namespace hosts (drivers/local_hosts.py) that join it.

Follows the project's Slurm notes (SLURM.md of the development machines): a fresh directory under /tmp (mode 0711, for
munge), a free port, the slurm.conf recipe plus spotbag's fragment
(controller/slurm/conf.py), slurmctld in the foreground, and a bridge whose first
address is the head node's, where configless slurmds in the VM hosts fetch their
configuration. Ready in well under a second; `stop()` cancels every job, halts the
VM hosts and removes everything.

Needs root, Slurm 22.05's slurmctld, slurmd and clients, munge and iproute2.
`missing()` says what is not there; tests skip on that, except under CI=true, where
it is a failure (.ci/run installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from collections.abc import Sequence
from pathlib import Path

from controller.slurm.conf import FragmentSettings, PoolConf, fragment
from controller.slurm.hooks_install import HookInstall, install_hooks

TOOLS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged", "ip", "nsenter")

BASE_CONF = """\
ClusterName={cluster}
SlurmctldHost={hostname}({head})
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
StateSaveLocation={base}/state
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdSpoolDir=/var/spool/slurmd
SlurmdPidFile=/run/slurmd.pid
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The VM hosts share this host's 2 cores: trust the CPUs a node declares.
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,sched_interval=1,default_queue_depth=1000,sched_min_interval=100000
MailProg=/bin/true
MinJobAge=600
KillWait=5
SlurmdTimeout=60
InactiveLimit=0
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
    """munged + slurmctld on a bridge of its own; VM hosts join as nodes."""

    def __init__(
        self,
        *,
        pools: Sequence[PoolConf] = (),
        hooks_dir: Path | None = None,
        extra_conf: str = "",
        suspend_time_s: int = 20,
        resume_timeout_s: int = 60,
    ) -> None:
        self.base = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-slurm-"))
        self.base.chmod(0o711)
        self.pools = tuple(pools)
        self.hooks_dir = hooks_dir or self.base / "hooks"
        self.extra_conf = extra_conf
        self.suspend_time_s = suspend_time_s
        self.resume_timeout_s = resume_timeout_s
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
        """(Re)install the hooks calling `url` back (they read their config per run)."""
        if secret is not None:
            self.hook_secret = secret
        install_hooks(
            HookInstall(
                dest=self.hooks_dir,
                config_path=self.hook_config,
                url=url,
                secret=self.hook_secret,
                spool_dir=self.spool_dir,
                pool_partitions=[p.partition for p in self.pools],
                slurm_conf=str(self.conf),
                bin_dir=os.path.dirname(shutil.which("sinfo") or "/usr/bin/sinfo"),
                python=sys.executable,
                timeout_s=2.0,
                power_up_wait_s=self.resume_timeout_s,
                **changes,
            )
        )

    def fragment_settings(self) -> FragmentSettings:
        return FragmentSettings(
            hooks_dir=str(self.hooks_dir),
            pools=self.pools,
            suspend_time_s=self.suspend_time_s,
            resume_timeout_s=self.resume_timeout_s,
            max_dynamic_nodes=64,
        )

    # --- life ----------------------------------------------------------------------------

    def start(self, timeout_s: float = 20.0) -> SlurmCluster:
        for sub in ("state", "run", "log", "etc"):
            (self.base / sub).mkdir(exist_ok=True)
        self.munge_dir.mkdir(mode=0o711, exist_ok=True)
        self.munge_dir.chmod(0o711)
        self.munge_key.parent.mkdir(mode=0o700, exist_ok=True)
        self.munge_key.write_bytes(os.urandom(1024))
        self.munge_key.chmod(0o600)
        self.hooks_dir.mkdir(parents=True, exist_ok=True)
        self.point_hooks("http://127.0.0.1:9")  # nobody there yet: events are spooled
        self._bridge_up()
        self.conf.write_text(
            BASE_CONF.format(
                cluster=self.cluster,
                hostname=socket.gethostname().split(".")[0],
                head=self.head,
                port=self.port,
                munge_socket=self.munge_socket,
                base=self.base,
            )
            + fragment(self.fragment_settings())
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
                self.stop()
                raise RuntimeError(
                    "slurmctld did not answer:\n"
                    + (self.base / "log" / "slurmctld.log").read_text()
                )
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

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root", check=False, timeout=10)
        # Every VM host on the bridge: their namespaces hold slurmd, slurmstepd and jobs.
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(
            ["ip", "-o", "link", "show", "master", self.bridge], capture_output=True, text=True
        ).stdout
        namespaces = [line.split()[0] for line in listed.splitlines() if line.strip()]
        for namespace in namespaces:
            peer = subprocess.run(
                ["ip", "-n", namespace, "-o", "link", "show", "eth0"],
                capture_output=True,
                text=True,
            ).stdout
            # A namespace whose eth0 is the peer of a veth on our bridge is one of ours.
            index = peer.split("@if")[-1].split(":")[0] if "@if" in peer else ""
            if index and f"\n{index}: " in "\n" + links:
                _halt_namespace(namespace)
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
