"""The VM side of preemption notices: the local driver's metadata server answers as
GCE's and EC2's do (drivers/local_metadata.py), and the notice watcher each VM runs
(drivers/templates/notice_watch.py, as the boot script writes it) hears a notice there
and drains its Slurm node with the reason the controller reads (here a stand-in
scontrol on its PATH records what it was asked)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from controller.slurm.executor.nodes import notice_end
from drivers import bootstrap
from drivers.local_metadata import MetadataServer, iso

VM = "vm-1"


@pytest.fixture
async def server():
    made = MetadataServer(lambda address: VM if address == "127.0.0.1" else None)
    await made.start("127.0.0.1")
    yield made
    await made.close()


async def test_gce_preempted_turns_true_at_the_notice_and_a_waiting_request_returns(server):
    url = f"{server.url}/computeMetadata/v1/instance/preempted"
    flavor = {"Metadata-Flavor": "Google"}
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as answer:
            assert answer.status == 403  # no Metadata-Flavor header
        async with http.get(url, headers=flavor) as answer:
            assert answer.status == 200 and await answer.text() == "FALSE"
            etag = answer.headers["ETag"]
        # Nothing changes: the wait ends at its timeout with the same value.
        async with http.get(f"{url}?wait_for_change=true&timeout_sec=0.2", headers=flavor) as a:
            assert await a.text() == "FALSE" and a.headers["ETag"] == etag
        waiting = asyncio.ensure_future(
            http.get(f"{url}?wait_for_change=true&last_etag={etag}", headers=flavor)
        )
        await asyncio.sleep(0.2)
        assert not waiting.done()
        server.notice(VM, time.time() + 30)
        answer = await asyncio.wait_for(waiting, 5)
        assert await answer.text() == "TRUE" and answer.headers["ETag"] != etag
        answer.release()
        # A request naming an old ETag answers at once.
        async with http.get(f"{url}?wait_for_change=true&last_etag={etag}", headers=flavor) as a:
            assert await a.text() == "TRUE"


async def test_imds_v2_needs_a_token_and_tells_the_notice_and_a_rebalance(server):
    latest = f"{server.url}/latest"
    async with aiohttp.ClientSession() as http:
        action = f"{latest}/meta-data/spot/instance-action"
        rebalance = f"{latest}/meta-data/events/recommendations/rebalance"
        async with http.get(action) as answer:
            assert answer.status == 401  # IMDSv2: no token, no answer
        async with http.put(f"{latest}/api/token") as answer:
            assert answer.status == 400  # a token needs its TTL
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        async with http.put(f"{latest}/api/token", headers=ttl) as answer:
            token = {"X-aws-ec2-metadata-token": await answer.text()}
        for url in (action, rebalance):
            async with http.get(url, headers=token) as answer:
                assert answer.status == 404
        server.rebalance(VM, 1_800_000_000.0)
        async with http.get(rebalance, headers=token) as answer:
            assert await answer.json(content_type=None) == {"noticeTime": "2027-01-15T08:00:00Z"}
        async with http.get(action, headers=token) as answer:
            assert answer.status == 404  # a recommendation is not a notice
        server.notice(VM, 1_800_000_120.0)
        async with http.get(action, headers=token) as answer:
            body = await answer.json(content_type=None)
            assert body == {"action": "terminate", "time": "2027-01-15T08:02:00Z"}


async def test_only_the_vms_of_the_cloud_are_answered():
    server = MetadataServer(lambda address: None)
    await server.start("127.0.0.1")
    try:
        async with aiohttp.ClientSession() as http:
            url = f"{server.url}/computeMetadata/v1/instance/preempted"
            async with http.get(url, headers={"Metadata-Flavor": "Google"}) as answer:
                assert answer.status == 403
    finally:
        await server.close()


# --- the watcher, as a VM runs it ------------------------------------------------------


def stand_in_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A directory with an `scontrol` that appends its arguments to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    said = tmp_path / "scontrol.args"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {said}\n')
    scontrol.chmod(0o755)
    return bin_dir, said


async def start_watcher(
    tmp_path: Path, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, Path]:
    """The watcher as the boot script writes it, run as node_join.sh runs it."""
    bin_dir, said = stand_in_scontrol(tmp_path)
    watcher = tmp_path / "notice_watch.py"
    watcher.write_text(bootstrap.notice_watcher())
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(watcher),
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SPOTBAG_SLURM_NODE": "sb-vm-1", **env},
    )
    return process, said


async def drained(said: Path, lines: int = 1, timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if said.exists() and len(got := said.read_text().splitlines()) >= lines:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"the watcher did not drain the node {lines} time(s)")


@pytest.mark.processes
async def test_the_gce_watcher_drains_its_node_at_the_notice(server, tmp_path):
    process, said = await start_watcher(
        tmp_path,
        {
            "SPOTBAG_NOTICE_WATCH": "gce",
            "SPOTBAG_GCE_METADATA_URL": f"{server.url}/computeMetadata/v1",
            "SPOTBAG_NOTICE_LEAD_S": "20",
        },
    )
    try:
        await asyncio.sleep(1.0)
        assert not said.exists()  # no notice, no drain
        noticed_at = time.time()
        server.notice(VM, noticed_at + 20)
        (line,) = await drained(said)
        heard_s = time.time() - noticed_at
        assert heard_s < 1.0, heard_s  # wait_for_change: heard at once, not at a poll
        assert await asyncio.wait_for(process.wait(), 5) == 0  # its work is done
    finally:
        if process.returncode is None:
            process.kill()
    assert line.startswith("update nodename=sb-vm-1 state=DRAIN reason=spot notice: ends by ")
    ends_by = notice_end(line.partition("reason=")[2], 0.0)
    assert ends_by == pytest.approx(noticed_at + 20, abs=1.5)


@pytest.mark.processes
async def test_the_aws_watcher_drains_at_a_rebalance_then_at_the_notice(server, tmp_path):
    process, said = await start_watcher(
        tmp_path,
        {
            "SPOTBAG_NOTICE_WATCH": "aws",
            "SPOTBAG_AWS_METADATA_URL": server.url,
            "SPOTBAG_NOTICE_POLL_S": "0.2",
        },
    )
    try:
        await asyncio.sleep(0.6)
        assert not said.exists()
        server.rebalance(VM, time.time())
        (first,) = await drained(said)
        ends_by = float(int(time.time()) + 120)
        server.notice(VM, ends_by)
        _, second = await drained(said, 2)
        assert await asyncio.wait_for(process.wait(), 5) == 0
    finally:
        if process.returncode is None:
            process.kill()
    assert first.startswith("update nodename=sb-vm-1 state=DRAIN reason=spot rebalance: ")
    # EC2's time, as EC2 wrote it, read back to the second.
    reason = second.partition("reason=")[2]
    assert reason == f"spot notice: ends by {iso(ends_by)}"
    assert notice_end(reason, 0.0) == ends_by


@pytest.mark.processes
def test_the_boot_script_carries_the_watcher_only_when_asked(tmp_path):
    plain = bootstrap.render(None, {"SPOTBAG_VM_ID": "vm-1"})
    assert "notice_watch.py <<" not in plain
    pool_node = {"SPOTBAG_VM_ID": "vm-1", "SPOTBAG_NOTICE_WATCH": "gce"}
    assert "notice_watch.py <<" not in bootstrap.render(None, pool_node)
    asked = bootstrap.render(None, {**pool_node, "SPOTBAG_SLURM_DYNAMIC": "1"})
    start = asked.index("python3 -c")
    end = asked.index("\nSPOTBAG_NOTICE_WATCH\n", start) + len("\nSPOTBAG_NOTICE_WATCH\n")
    step = asked[start:end].replace("/etc/spotbag/notice_watch.py", str(tmp_path / "w.py"))
    subprocess.run(["bash", "-c", step], check=True)
    assert (tmp_path / "w.py").read_text() == bootstrap.notice_watcher()


def test_notice_reasons_are_read_as_the_watcher_writes_them():
    assert notice_end("spot notice: ends by 2027-01-15T08:02:00Z", 5.0) == 1_800_000_120.0
    assert notice_end("spot notice: ends by soon", 5.0) == 5.0  # unreadable: any moment
    assert notice_end("spot rebalance: recommended at 2027-01-15T08:00:00Z", 5.0) is None
    assert notice_end("Not responding", 5.0) is None


def test_an_ec2_slurm_nodes_user_data_with_the_watcher_fits_with_room_to_spare():
    """EC2 takes 16 KiB of user data: the bundled boot script of a Slurm node with the
    notice watcher (packed) leaves at least 1 KiB for longer settings (job users)."""
    from drivers.aws import USER_DATA_MAX_BYTES

    settings = {
        "SPOTBAG_VM_ID": "vm-3f9a0c21d7aa",
        "SPOTBAG_CONTROLLER_ID": "c" * 32,
        "SPOTBAG_CONTROLLER_URL": "http://head.internal:8080",
        "SPOTBAG_VM_TYPE": "m5.large-1a",
        "SPOTBAG_AWS_REGION": "us-east-1",
        "SPOTBAG_NOTICE_WATCH": "aws",
        "SPOTBAG_SLURM_NODE": "sb-vm-3f9a0c21d7aa",
        "SPOTBAG_SLURM_CONF_SERVER": "head.internal:6817",
        "SPOTBAG_SLURM_DYNAMIC": "1",
        "SPOTBAG_SLURM_FEATURES": "spotbag",
        "SPOTBAG_CPUS": "2",
        "SPOTBAG_MEMORY_MB": "8192",
        "SPOTBAG_GPUS": "0",
        "SPOTBAG_MUNGE_KEY": "aws-secretsmanager:spotbag/munge-key",
        "SPOTBAG_SHARED_DIR": "/var/lib/spotbag/shared",
        "SPOTBAG_SHARED_MOUNT": "head.internal:/var/lib/spotbag/shared",
        "SPOTBAG_JOB_USER": "spotbag",
        "SPOTBAG_JOB_UID": "999",
        "SPOTBAG_JOB_GID": "999",
    }
    script = bootstrap.render(None, settings, max_bytes=USER_DATA_MAX_BYTES)
    assert "notice_watch.py <<" in script
    assert len(script.encode()) <= USER_DATA_MAX_BYTES - 1024
