#!/usr/bin/env python3
"""Benchmark: the cloud drivers' cost of a launch/describe cycle for 1,000 VMs against
the mocked clouds (target: describe of 1,000 VMs <= 1 s).

Each mock runs in a child process (moto's EC2 server behind tests/fakes/aws.py, the
fake Compute API of tests/fakes/gce_api.py), so this process's CPU time is the
driver's own (SDK serialisation and parsing, our mapping), apart from the server's.
Per driver: launch 1,000 VMs (8 calls in flight, the default), describe all of them
(every one running: the steady state of a poll), preempt 1% and describe again (the
ended ones are read in detail), terminate all. Wall time, this process's CPU time and
the API calls each step made.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import against
from tee import Tee

N_VMS = 1000
REPEATS = 5
GCE_PROJECT, GCE_ZONE = "bench", "us-central1-a"


def serve(kind: str, conn) -> None:
    """Child process: run the mock, answer commands until "stop"."""
    if kind == "aws":
        from tests.fakes.aws import MotoCloud

        cloud = MotoCloud()
        conn.send(cloud.endpoint_url)
    else:
        from tests.fakes.gce_api import FakeGceApi

        api = FakeGceApi(boot_s=0.0, stop_s=0.0, zones=(GCE_ZONE,)).start()
        conn.send(api.endpoint)
    while True:
        command, args = conn.recv()
        if command == "stop":
            conn.send("ok")
            return
        if command == "preempt":
            for vm_id in args:
                if kind == "aws":
                    cloud.interrupt(vm_id)
                else:
                    zone, _, name = vm_id.partition("/")
                    api.preempt(GCE_PROJECT, zone, name)
            conn.send("ok")
        elif command == "calls":
            conn.send(dict(cloud.layer.calls) if kind == "aws" else {})


def make_driver(kind: str, endpoint: str):
    from drivers.base import VmType

    if kind == "aws":
        import boto3

        from drivers.aws import AwsDriver, AwsSettings

        vm_type = VmType("m5.large", 2, 8.0, 0, 0.035, 0.096, "us-east-1a")
        settings = AwsSettings(
            region="us-east-1", controller_id="bench", endpoint_url=endpoint, image_id="ami-0abc"
        )
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        return AwsDriver([vm_type], settings, session=session), vm_type
    from google.auth.credentials import AnonymousCredentials

    from drivers.gce import GceDriver, GceSettings

    vm_type = VmType("e2-standard-2", 2, 8.0, 0, 0.02, 0.067, GCE_ZONE)
    settings = GceSettings(
        project=GCE_PROJECT,
        zones=(GCE_ZONE,),
        controller_id="bench",
        api_endpoint=endpoint,
        operation_poll_s=0.02,
    )
    return GceDriver([vm_type], settings, credentials=AnonymousCredentials()), vm_type


async def timed(step):
    wall, cpu = time.perf_counter(), time.process_time()
    result = await step()
    return result, time.perf_counter() - wall, time.process_time() - cpu


async def bench(kind: str, conn, out) -> None:
    from drivers.base import LaunchRequest, VmState

    endpoint = conn.recv()
    driver, vm_type = make_driver(kind, endpoint)

    async def launch_all():
        return await asyncio.gather(
            *(driver.launch(LaunchRequest(f"bench-{i}", vm_type)) for i in range(N_VMS))
        )

    launched, wall, cpu = await timed(launch_all)
    ids = [s.vm_id for s in launched]
    print(
        f"{kind}: launch {N_VMS} VMs: {wall:.2f} s wall ({wall / N_VMS * 1e3:.1f} ms per VM), "
        f"driver CPU {cpu:.2f} s",
        file=out,
    )

    async def describe_all():
        return await driver.describe(ids)

    await describe_all()  # warm: every VM seen running once
    walls, cpus = [], []
    for _ in range(REPEATS):
        statuses, wall, cpu = await timed(describe_all)
        assert len(statuses) == N_VMS
        walls.append(wall)
        cpus.append(cpu)
    running = sum(s.state is VmState.RUNNING for s in statuses.values())
    print(
        f"{kind}: describe {N_VMS} VMs ({running} running): median {statistics.median(walls):.3f} s "
        f"wall (min {min(walls):.3f}, max {max(walls):.3f}), driver CPU "
        f"{statistics.median(cpus):.3f} s {against(statistics.median(walls), 1, 's')}",
        file=out,
    )

    victims = ids[:: N_VMS // 10][:10]
    conn.send(("preempt", victims))
    conn.recv()
    statuses, wall, cpu = await timed(describe_all)
    preempted = sum(s.state is VmState.PREEMPTED for s in statuses.values())
    print(
        f"{kind}: describe {N_VMS} VMs after {len(victims)} preemptions: {wall:.3f} s wall, "
        f"driver CPU {cpu:.3f} s, {preempted} reported PREEMPTED",
        file=out,
    )
    assert preempted == len(victims)

    _, wall, cpu = await timed(lambda: driver.terminate(ids))
    print(f"{kind}: terminate {N_VMS} VMs: {wall:.2f} s wall, driver CPU {cpu:.2f} s", file=out)
    conn.send(("calls", None))
    calls = conn.recv()
    if calls:
        print(f"{kind}: EC2 calls in all: {dict(sorted(calls.items()))}", file=out)
    conn.send(("stop", None))
    conn.recv()


def main() -> None:
    out = Tee(sys.stdout)
    print(f"Cloud drivers against the mocks, {N_VMS} VMs (servers in child processes)", file=out)
    context = multiprocessing.get_context("spawn")
    for kind in ("aws", "gce"):
        parent, child = context.Pipe()
        process = context.Process(target=serve, args=(kind, child), daemon=True)
        process.start()
        asyncio.run(bench(kind, parent, out))
        process.join(30)
    results = Path(__file__).resolve().parent / "results" / "cloud_drivers.txt"
    results.write_text("".join(out.parts))


if __name__ == "__main__":
    main()
