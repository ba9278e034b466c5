"""A signed power-saving callback whose hostlist names more nodes than the pools declare
is refused before it is expanded: "spot-[0-99999999]" (17 characters, 10^8 names)
used to hold the daemon's loop for minutes and take gigabytes. It gets a 400 (which
the hooks do not send again) at once, and the daemon goes on answering.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import SLURM_POOL
from tests.integration.test_slurm_callbacks import post_event

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_a_resume_naming_more_nodes_than_the_pools_is_refused_unexpanded(
    make_slurm_daemon, slurm_cluster
):
    daemon = make_slurm_daemon(max_vms=1)
    daemon.config_path.write_text(daemon.config_path.read_text() + SLURM_POOL)
    client = daemon.start()
    secret = slurm_cluster.hook_secret
    # Generous: a loop that expanded the list would not answer within minutes.
    deadline = time.monotonic() + 20
    event = {"event": "resume", "event_id": "e1", "nodes": "spot-[0-99999999]"}
    status, answer = post_event(client.url, secret, event)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_hostlist"
    assert "names 100000000 nodes, more than the 4" in answer["error"]["message"]
    event = {"event": "suspend", "event_id": "e2", "nodes": "spot-[0-3],spot-[0-3]"}
    status, answer = post_event(client.url, secret, event)
    assert status == 400 and "names 8 nodes" in answer["error"]["message"], answer
    status, answer = post_event(client.url, secret, {"event": "resume", "nodes": "spot-[9-1]"})
    assert status == 400 and "runs backwards" in answer["error"]["message"], answer
    assert client.vms(include_ended=True)["vms"] == []  # nothing was launched
    assert time.monotonic() < deadline
    # Within the bound, a node that is not the pools' is noted and not acted on.
    status, answer = post_event(
        client.url, secret, {"event": "suspend", "event_id": "e3", "nodes": "other-[0-3]"}
    )
    assert (status, answer["applied"]) == (200, False), answer


def test_numbers_out_of_bounds_in_a_signed_event_are_400_not_500(make_slurm_daemon, slurm_cluster):
    # An infinite `submit` made the event's key (int(submit)) raise OverflowError: a 500.
    daemon = make_slurm_daemon(max_vms=1)
    client = daemon.start()
    secret = slurm_cluster.hook_secret
    before = daemon.log().count("Traceback")
    for event, field in (
        ({"event": "jobcomp", "job_id": "7", "submit": float("inf"), "end": 1.0}, "submit"),
        ({"event": "jobcomp", "job_id": "7", "submit": 1e300, "end": 1.0}, "submit"),
        ({"event": "jobcomp", "job_id": "7", "end": -1.0}, "end"),
        ({"event": "jobcomp", "job_id": "7", "cpus": 1e12}, "cpus"),
        ({"event": "prolog_slurmctld", "job_id": "7", "restart_count": 2**70}, "restart_count"),
        ({"event": "jobcomp", "job_id": "7\n"}, "job_id"),
    ):
        status, answer = post_event(client.url, secret, event)
        assert status == 400, (event, answer)
        assert answer["error"]["code"] == "invalid_event"
        assert f"{field}: " in answer["error"]["message"], answer
    assert daemon.log().count("Traceback") == before
