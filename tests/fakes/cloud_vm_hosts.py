"""The "hypervisor" behind a mocked cloud: VMs that moto or the fake GCE API say run
are booted as VM hosts on the test Slurm cluster's bridge (drivers/local_hosts.py),
each running the user data / startup script the driver rendered for it, as a cloud
VM runs it at first boot; VMs the cloud ended (a spot interruption, a termination)
are halted at once.

It watches from a thread of its own (the daemon under test is another process), with
the VMs' "instance role" given as their environment: for EC2 the dummy credentials
moto accepts, and for both a PATH whose python3 has boto3 (as an image for spotbag
would).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

# vm id -> (alive, boot script)
Listing = Callable[[], Mapping[str, tuple[bool, str]]]


def moto_listing(cloud) -> Listing:
    """The instances of a tests.fakes.aws.MotoCloud, with their user data."""
    scripts: dict[str, str] = {}

    def listing() -> dict[str, tuple[bool, str]]:
        pages = cloud.client.get_paginator("describe_instances").paginate()
        found = {}
        for page in pages:
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    vm_id = instance["InstanceId"]
                    alive = instance["State"]["Name"] in ("pending", "running")
                    if vm_id not in scripts and alive:
                        data = cloud.client.describe_instance_attribute(
                            InstanceId=vm_id, Attribute="userData"
                        )["UserData"].get("Value", "")
                        scripts[vm_id] = base64.b64decode(data).decode() if data else ""
                    found[vm_id] = (alive, scripts.get(vm_id, ""))
        return found

    return listing


def gce_listing(api, project: str) -> Listing:
    """The instances of a tests.fakes.gce_api.FakeGceApi, with their startup scripts."""

    def listing() -> dict[str, tuple[bool, str]]:
        found = {}
        for instance in api.instances(project):
            items = instance.get("metadata", {}).get("items", [])
            script = next((i["value"] for i in items if i["key"] == "startup-script"), "")
            zone = instance["zone"].rsplit("/", 1)[-1]
            found[f"{zone}/{instance['name']}"] = (instance["status"] == "RUNNING", script)
        return found

    return listing


class CloudVmHosts:
    """Boots and halts VM hosts as the mocked cloud's VMs come and go."""

    def __init__(
        self,
        cluster,
        consoles: Path,
        listing: Listing,
        env: Mapping[str, str] | None = None,
        interval_s: float = 0.2,
    ) -> None:
        self.hosts = cluster.hosts(consoles)
        self.listing = listing
        self.interval_s = interval_s
        python_bin = os.path.dirname(sys.executable)  # its python3 has boto3
        self.env = {
            "PATH": f"{python_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            **(env or {}),
        }
        self.booted: dict[str, str] = {}  # vm id -> its boot script
        self.halted: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloud-vm-hosts", daemon=True)

    def start(self) -> CloudVmHosts:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for vm_id, (alive, script) in self.listing().items():
                    if alive and vm_id not in self.booted and script:
                        self.booted[vm_id] = script
                        name = vm_id.rsplit("/", 1)[-1]
                        await self.hosts.boot(vm_id, script, hostname=name, env=self.env)
                    elif not alive and vm_id in self.booted and vm_id not in self.halted:
                        self.halted.append(vm_id)
                        await self.hosts.halt(vm_id)
            except Exception as exc:  # shown by the test that uses it
                self.errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval_s)
        for vm_id in list(self.booted):  # each one: a host left up keeps its address
            with contextlib.suppress(Exception):
                await self.hosts.halt(vm_id)

    def console(self, vm_id: str) -> str:
        host = self.hosts.host(vm_id)
        return host.console.read_text() if host is not None and host.console.exists() else ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
