"""VMs of the local driver as hosts of their own on this machine.

With `[driver] hosts = "netns"` every local "VM" is a network namespace with its own
address on a bridge (the head node is the bridge's first address) and private
/run, /etc/munge, /etc/spotbag, /var/log, /var/lib/munge and /var/spool/slurmd, in
which the VM's boot script (drivers/bootstrap.py) runs as a cloud VM runs its user
data: it starts munged and a slurmd that joins the head node's Slurm, so the jobs
Slurm runs "on the VM" run in that namespace, reached over the network. The rest of
the filesystem is shared with the head node, as an NFS export would be.

Halting a VM kills every process in its namespace (munged, slurmd, slurmstepd, the
job) at once, as a preemption does, and removes the namespace.

VM hosts outlive the controller, as cloud VMs do: each keeps a record (its VM's id,
token, type, launch and sampled death) beside its console, and `adopt()` finds the
live ones again after a restart. Namespaces are named `<prefix><n>`.

Needs root and iproute2 (`ip`), util-linux (`nsenter`, `unshare`). Every command runs
as an asyncio subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import os
import secrets
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# What each VM host keeps to itself (tmpfs mounts); everything else is the head's.
PRIVATE_DIRS = (
    "/run",
    "/etc/spotbag",
    "/etc/munge",
    "/var/lib/munge",
    "/var/log",
    "/var/spool/slurmd",
    "/var/lib/slurm",
)


class HostError(RuntimeError):
    """A VM host could not be set up or removed; the message has the command's error."""


@dataclass(frozen=True)
class Host:
    vm_id: str
    namespace: str
    veth: str
    address: str
    console: Path  # the boot script's output, like a cloud's serial console
    record: dict = field(default_factory=dict, hash=False)  # what the driver keeps with it


async def _run(*argv: str, check: bool = True, timeout_s: float = 30.0) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise HostError(f"{shlex.join(argv)}: no answer within {timeout_s:g} s") from None
    if check and process.returncode != 0:
        raise HostError(f"{shlex.join(argv)}: {err.decode(errors='replace').strip()}")
    return out.decode(errors="replace")


class NamespaceHosts:
    """Network-namespace VM hosts on one bridge."""

    def __init__(
        self,
        *,
        bridge: str,
        subnet: str,
        consoles: Path,
        prefix: str,
        private_dirs: tuple[str, ...] = PRIVATE_DIRS,
    ) -> None:
        self.network = ipaddress.ip_network(subnet)
        if self.network.num_addresses < 4:
            raise HostError(f"subnet {subnet} has no room for VM hosts")
        self.bridge = bridge
        self.gateway = str(next(self.network.hosts()))  # the head node on the bridge
        self.consoles = consoles
        self.prefix = prefix
        self.private_dirs = private_dirs
        self._hosts: dict[str, Host] = {}
        self._numbers = itertools.count(1)
        self._tag = secrets.token_hex(2)  # veth names are global and at most 15 bytes
        self._bridge_ready = False
        self._lock = asyncio.Lock()
        self._reapers: set[asyncio.Future] = set()  # boot scripts still running

    @property
    def head_address(self) -> str:
        return self.gateway

    async def ensure_bridge(self) -> None:
        """The bridge with the head's address on it (made if missing, kept if there)."""
        if self._bridge_ready:
            return
        links = await _run("ip", "-o", "link", "show", "type", "bridge")
        if f": {self.bridge}:" not in links:
            await _run("ip", "link", "add", self.bridge, "type", "bridge")
        addresses = await _run("ip", "-o", "addr", "show", "dev", self.bridge)
        if f" {self.gateway}/" not in addresses:
            prefix_len = self.network.prefixlen
            await _run("ip", "addr", "add", f"{self.gateway}/{prefix_len}", "dev", self.bridge)
        await _run("ip", "link", "set", self.bridge, "up")
        self._bridge_ready = True

    def _free_address(self) -> str:
        taken = {h.address for h in self._hosts.values()} | {self.gateway}
        # Start past the bridge's first few addresses (the head may hold more than one).
        for candidate in itertools.islice(self.network.hosts(), 8, None):
            if str(candidate) not in taken:
                return str(candidate)
        raise HostError(f"no free address left in {self.network}")

    async def boot(
        self,
        vm_id: str,
        script: str,
        *,
        hostname: str = "",
        env: Mapping[str, str] | None = None,
        record: Mapping[str, object] | None = None,
    ) -> Host:
        """Make the VM's host and start its boot script there (in the background: the
        script's output goes to its console file). Returns once the script started."""
        async with self._lock:
            await self.ensure_bridge()
            number = next(self._numbers)
            host = Host(
                vm_id=vm_id,
                namespace=f"{self.prefix}{number}",
                veth=f"sv{self._tag}{number}"[:15],
                address=self._free_address(),
                console=self.consoles / vm_id / "console.log",
                record=dict(record or {}),
            )
            self._hosts[vm_id] = host
        try:
            await self._plumb(host)
            self._write_record(host)
            await self._start_script(host, script, hostname or vm_id, env or {})
        except BaseException:
            with contextlib.suppress(Exception):
                await self.halt(vm_id)
            raise
        return host

    async def _plumb(self, host: Host) -> None:
        ns, veth = host.namespace, host.veth
        await _run("ip", "netns", "add", ns)
        await _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        await _run("ip", "link", "set", veth, "master", self.bridge)
        await _run("ip", "link", "set", veth, "up")
        prefix_len = self.network.prefixlen
        await _run("ip", "-n", ns, "addr", "add", f"{host.address}/{prefix_len}", "dev", "eth0")
        await _run("ip", "-n", ns, "link", "set", "eth0", "up")
        await _run("ip", "-n", ns, "link", "set", "lo", "up")
        await _run("ip", "-n", ns, "route", "add", "default", "via", self.gateway)

    async def _start_script(
        self, host: Host, script: str, hostname: str, env: Mapping[str, str]
    ) -> None:
        host.console.parent.mkdir(parents=True, exist_ok=True)
        script_path = host.console.parent / "boot.sh"
        script_path.write_text(script)
        script_path.chmod(0o700)
        # Its own name resolves (munged and slurmd look it up); there is no DNS server
        # on the bridge, so lookups of other names fail at once instead of timing out.
        etc_hosts = host.console.parent / "hosts"
        etc_hosts.write_text(
            f"127.0.0.1 localhost\n{host.address} {hostname}\n{self.gateway} spotbag-head\n"
        )
        resolv = host.console.parent / "resolv.conf"
        resolv.write_text("options timeout:1 attempts:1\n")
        mounts = [
            f"mkdir -p {shlex.quote(d)} && mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(d)}"
            for d in self.private_dirs
        ]
        mounts += [
            f"mount --bind {shlex.quote(str(etc_hosts))} /etc/hosts",
            f"mount --bind {shlex.quote(str(resolv))} /etc/resolv.conf",
        ]
        # The VM's "init": its own mount and UTS namespaces inside its network namespace,
        # private directories, its hostname, then the boot script.
        init = (
            f"set -e; {'; '.join(mounts)}; hostname {shlex.quote(hostname)}; "
            f"exec /bin/bash {shlex.quote(str(script_path))}"
        )
        console = host.console.open("ab")
        try:
            process = await asyncio.create_subprocess_exec(
                "nsenter",
                f"--net=/run/netns/{host.namespace}",
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                init,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=console,
                stderr=asyncio.subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env},
                start_new_session=True,
            )
        finally:
            console.close()
        # Reap the script when it ends (daemons it starts live on in the namespace).
        task = asyncio.ensure_future(process.wait())
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    def _records(self) -> Path:
        return self.consoles / "hosts"

    def _write_record(self, host: Host) -> None:
        self._records().mkdir(parents=True, exist_ok=True)
        data = {
            "vm_id": host.vm_id,
            "namespace": host.namespace,
            "veth": host.veth,
            "address": host.address,
            "console": str(host.console),
            "record": host.record,
        }
        tmp = self._records() / f".{host.namespace}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self._records() / f"{host.namespace}.json")

    async def adopt(self) -> list[Host]:
        """The live hosts of this prefix (after a controller restart), watched again; a
        namespace without its record, or a record without its namespace, is removed."""
        listed = await _run("ip", "netns", "list", check=False)
        live = {line.split()[0] for line in listed.splitlines() if line.strip()}
        live = {n for n in live if n.startswith(self.prefix)}
        adopted = []
        for path in sorted(self._records().glob("*.json")) if self._records().is_dir() else ():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            if data.get("namespace") not in live:
                path.unlink(missing_ok=True)
                continue
            host = Host(
                data["vm_id"],
                data["namespace"],
                data["veth"],
                data["address"],
                Path(data["console"]),
                data.get("record", {}),
            )
            self._hosts[host.vm_id] = host
            live.discard(host.namespace)
            adopted.append(host)
        for namespace in live:  # no record: nobody can say what it was
            await self._remove(namespace)
        numbers = [int(h.namespace[len(self.prefix) :]) for h in adopted]
        self._numbers = itertools.count(max(numbers, default=0) + 1)
        return adopted

    async def halt(self, vm_id: str) -> None:
        """Kill everything in the VM's host and remove it; a VM already gone is fine."""
        host = self._hosts.pop(vm_id, None)
        if host is not None:
            await self._remove(host.namespace)
            (self._records() / f"{host.namespace}.json").unlink(missing_ok=True)

    async def _remove(self, namespace: str) -> None:
        """Stop every process of the host, then kill them: a VM dies at once, all of it.
        Killed one by one as they run, a job's wrapper could outlive its program for a
        moment and record how it died, which no real VM's end leaves behind."""
        stopped: set[str] = set()
        for _ in range(50):  # new processes may start until every one is stopped
            pids = set((await _run("ip", "netns", "pids", namespace, check=False)).split())
            if pids <= stopped:
                break
            for pid in pids - stopped:
                with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                    os.kill(int(pid), signal.SIGSTOP)
            stopped |= pids
        for _ in range(50):
            left = (await _run("ip", "netns", "pids", namespace, check=False)).split()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
            await asyncio.sleep(0.02)
        await _run("ip", "netns", "delete", namespace, check=False)

    async def halt_all(self) -> int:
        """Remove every host this prefix names, ours or a crashed controller's."""
        self._hosts.clear()
        listed = await _run("ip", "netns", "list", check=False)
        names = [line.split()[0] for line in listed.splitlines() if line.strip()]
        ours = [n for n in names if n.startswith(self.prefix)]
        for namespace in ours:
            await self._remove(namespace)
        return len(ours)

    def host(self, vm_id: str) -> Host | None:
        return self._hosts.get(vm_id)

    def vm_at(self, address: str) -> str | None:
        """The VM whose host has this address on the bridge (None: no VM of ours)."""
        return next((h.vm_id for h in self._hosts.values() if h.address == address), None)
