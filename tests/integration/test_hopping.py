"""The hopper in the running daemon (local driver, real processes, a replayed price trace):
a checkpointable job starts on the type that is cheapest, the trace makes that type
dear, and the hopper moves the job — checkpoint, stop, resume on a new VM of the type
now cheapest — logging the move with its reason, and the job computes exactly what an
uninterrupted run computes."""

from __future__ import annotations

import gzip
import json
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Daemon, wait_for_bag, wait_until

pytestmark = pytest.mark.integration

PROGRAM = REPO / "examples" / "programs" / "logistic.py"
ARGS = "--r 3.7 --iterations 400000 --chunks 400 --seconds 12 --progress"
TOKEN = "hop-test"
CONFIG = """
[api]
host = "127.0.0.1"
port = 0
token = "{token}"

[scheduler]
max_vms = 3
idle_timeout_s = 30.0
poll_interval_s = 0.1

[driver]
name = "local"
boot_delay_s = 0.2
time_scale = 600.0

[preemption]
model = "none"

[ledger]
new_accounts = "unlimited"

[hopping]
policy = "cost"
interval_s = 300.0
window_s = 3600.0
trace = "{trace}"
trace_types = {{ "a-2" = "x.a", "b-2" = "x.b" }}

[[vm_types]]
name = "a-2"
cpus = 2
memory_gb = 8.0
spot_price_per_hour = 0.03
on_demand_price_per_hour = 0.1
zone = "local"

[[vm_types]]
name = "b-2"
cpus = 2
memory_gb = 8.0
spot_price_per_hour = 0.05
on_demand_price_per_hour = 0.1
zone = "local"
"""


def write_trace(path: Path) -> None:
    """x.a costs 0.01 for the first 40 trace minutes, then 0.09; x.b costs 0.05."""
    rows = [
        "region,az,instance_type,product,timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr",
        "r,r1,x.a,Linux,2015-03-01 00:00:00+00:00,0.01,0.1",
        "r,r1,x.b,Linux,2015-03-01 00:00:00+00:00,0.05,0.1",
        "r,r1,x.a,Linux,2015-03-01 00:40:00+00:00,0.09,0.1",
        "r,r1,x.b,Linux,2015-03-02 00:00:00+00:00,0.05,0.1",
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")


@pytest.fixture
def daemon(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    trace = tmp_path / "prices.csv.gz"
    write_trace(trace)
    config = state / "spotbag.toml"
    config.write_text(CONFIG.format(token=TOKEN, trace=trace))
    made = Daemon(state, config, TOKEN)
    yield made
    if made.process is not None and made.process.poll() is None:
        made.stop(signal.SIGKILL)


def test_a_job_moves_to_the_type_that_became_cheaper_and_resumes(daemon):
    client = daemon.start()
    bag = client.submit(
        {
            "account": "lab",
            "command": f"{sys.executable} {PROGRAM} {ARGS}",
            "resources": {"cpus": 2, "memory_gb": 4},
            "max_runtime_s": 120,
            "estimated_runtime_s": 12,
            "checkpointable": True,
            "checkpoint_cost_s": 0.01,
            "workdir": str(REPO),
        }
    )
    done = wait_for_bag(client, bag["id"], 90)
    assert done["state"] == "succeeded", daemon.log()

    job = client.job(f"{bag['id']}-0")
    first, second = job["attempt_list"][:2]
    vm_types = {vm["id"]: vm["vm_type"] for vm in client.vms(include_ended=True)["vms"]}
    assert vm_types[first["vm_id"]] == "a-2"  # the cheapest when the job started
    assert first["state"] == "lost" and first["reason"].startswith("migrated: cost: a-2 ")
    assert vm_types[second["vm_id"]] == "b-2" and second["state"] == "succeeded"
    assert job["attempts"] == 2

    hopping = client.hopping()
    (move,) = hopping["migrations"]
    assert move["from_type"] == "a-2" and move["to_type"] == "b-2"
    assert move["price_from"] == pytest.approx(0.09) and move["price_to"] == pytest.approx(0.05)
    assert move["index_price"] == pytest.approx((0.09 + 0.05) / 2 / 4)  # sqrt(2 × 8) = 4
    assert json.loads(move["jobs"]) == [[bag["id"], 0]]
    assert {row["vm_type"]: row["price_now"] for row in hopping["market"]} == {
        "a-2": pytest.approx(0.09),
        "b-2": pytest.approx(0.05),
    }

    # The move was a checkpoint and a resume, not a restart.
    before = (REPO / first["log_path"]).read_text()
    after = (REPO / second["log_path"]).read_text()
    saved = [int(n) for n in re.findall(r"checkpoint at iteration (\d+)", before)]
    (resumed_from,) = [int(n) for n in re.findall(r"resuming from iteration (\d+)", after)]
    assert saved and resumed_from == saved[-1] > 0
    result = json.loads(after.strip().splitlines()[-1])
    clean = subprocess.run(
        [sys.executable, str(PROGRAM), *ARGS.replace("--seconds 12", "--seconds 0").split()],
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
        env={"SPOTBAG_CHECKPOINT_DIR": "/nonexistent"},
    )
    assert result["lyapunov"] == json.loads(clean.stdout.strip().splitlines()[-1])["lyapunov"]
    assert result["attempt"] == 2

    # Prices were kept in the store; the drained VM was ended.
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        samples = conn.execute(
            "SELECT vm_type, count(*) FROM price_samples GROUP BY vm_type"
        ).fetchall()
    assert {t for t, n in samples if n >= 2} == {"a-2", "b-2"}

    def drained() -> dict | None:
        vms = {vm["id"]: vm for vm in client.vms(include_ended=True)["vms"]}
        vm = vms[first["vm_id"]]
        return vm if vm["state"] == "terminated" else None

    vm = wait_until(drained, 20, 0.2, "the drained VM to end")
    assert vm["reason"].startswith("drained: cost: a-2")

    # The report prices each VM by the samples of its life and shows the index beside.
    report = client.report(bag=bag["id"])
    by_type = {row["vm_type"]: row for row in report["by_vm_type"]}
    a, b = by_type["a-2 (spot)"], by_type["b-2 (spot)"]
    assert 0.01 <= a["price_paid_per_h"] <= 0.09 and b["price_paid_per_h"] == pytest.approx(0.05)
    # The index for a 2 vCPU/8 GB type is the mean of the two prices: 0.03, then 0.07.
    assert 0.03 <= a["index_price_per_h"] <= 0.07 and b["index_price_per_h"] == pytest.approx(0.07)
    assert report["price_samples"] >= 4

    from tests.integration.test_cli import spotbag

    shown = spotbag("hopping", state_dir=daemon.state_dir).stdout
    assert "policy cost" in shown and "a-2" in shown and "$0.09 -> $0.05" in shown
    daemon.stop()
