"""spotbag's notice watcher: on a spot VM that joined Slurm, it asks the cloud's metadata
server whether the VM is about to be taken and, when it is, drains the VM's node with a
reason the controller's node poll reads (docs/checkpoints.md#notices):

  spot notice: ends by 2026-11-26T21:30:00Z      the cloud takes the VM by then
  spot rebalance: recommended at 2026-11-26T21:20:00Z   EC2: at elevated risk

Standard library only. node_join.sh installs it beside node.env and starts it, with the
node's settings in its environment (SPOTBAG_NOTICE_WATCH: aws or gce). AWS: IMDSv2 (a
session token, then spot/instance-action and events/recommendations/rebalance every
SPOTBAG_NOTICE_POLL_S, 2 s); GCE: instance/preempted, waited on (wait_for_change), a
notice SPOTBAG_NOTICE_LEAD_S (30 s) ahead. SPOTBAG_AWS_METADATA_URL and
SPOTBAG_GCE_METADATA_URL point it elsewhere (the local driver's metadata server).
No credential: Slurm takes root's word on a node of the cluster (munge).
"""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

ENV = os.environ
# The metadata server is link-local: never through a proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def iso(epoch: float) -> str:
    # timezone.utc, not datetime.UTC: images may have a Python older than 3.11.
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


def ask(url: str, headers: dict, method: str = "GET", timeout: float = 10) -> tuple:
    """(HTTP status, body, headers); status 0 when the server cannot be reached."""
    try:
        with OPENER.open(
            urllib.request.Request(url, None, headers, method=method), None, timeout
        ) as answer:
            return answer.status, answer.read().decode(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, "", exc.headers
    except (OSError, ValueError):
        return 0, "", {}


def drain(reason: str) -> None:
    """Drain the node (no new job starts there) saying why; tried until Slurm takes it."""
    argv = [
        "scontrol",
        "update",
        "nodename=" + ENV["SPOTBAG_SLURM_NODE"],
        "state=DRAIN",
        "reason=" + reason,
    ]
    for _ in range(120):
        if subprocess.run(argv).returncode == 0:
            print("spotbag-notice-watch: drained:", reason, flush=True)
            return
        time.sleep(1)


def watch_gce() -> None:
    base = (
        ENV.get("SPOTBAG_GCE_METADATA_URL") or "http://metadata.google.internal/computeMetadata/v1"
    )
    lead_s = float(ENV.get("SPOTBAG_NOTICE_LEAD_S") or 30)
    etag = ""
    while True:
        # The value now first, then waits for it to change from that (its ETag).
        wait = f"?wait_for_change=true&timeout_sec=300&last_etag={etag}" if etag else ""
        status, body, headers = ask(
            base + "/instance/preempted" + wait, {"Metadata-Flavor": "Google"}, timeout=330
        )
        if status == 200 and body.strip() == "TRUE":
            return drain("spot notice: ends by " + iso(time.time() + lead_s))
        if status == 200:
            etag = headers.get("ETag", "")
        else:
            time.sleep(2)


def watch_aws() -> None:
    base = (ENV.get("SPOTBAG_AWS_METADATA_URL") or "http://169.254.169.254") + "/latest"
    every_s = float(ENV.get("SPOTBAG_NOTICE_POLL_S") or 2)
    token, rebalanced = "", False
    while True:
        if not token:
            status, token, _ = ask(
                base + "/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, "PUT"
            )
            token = token if status == 200 else ""
        if token:
            headers = {"X-aws-ec2-metadata-token": token}
            status, body, _ = ask(base + "/meta-data/spot/instance-action", headers)
            if status == 200:
                return drain("spot notice: ends by " + json.loads(body)["time"])
            if status == 401:  # the token expired
                token = ""
                continue
            if not rebalanced:
                status, body, _ = ask(base + "/meta-data/events/recommendations/rebalance", headers)
                if status == 200:
                    drain("spot rebalance: recommended at " + json.loads(body)["noticeTime"])
                    rebalanced = True
        time.sleep(every_s)


if __name__ == "__main__":
    {"aws": watch_aws, "gce": watch_gce}[ENV["SPOTBAG_NOTICE_WATCH"]]()
