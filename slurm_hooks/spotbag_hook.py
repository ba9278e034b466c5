#!/usr/bin/python3 -IS
"""spotbag's Slurm hook: tells the controller what slurmctld saw, over signed HTTP.

Installed (`spotbag slurm install-hooks`) behind small sh wrappers as slurmctld's
JobCompLoc (jobcomp/script), PrologSlurmctld, EpilogSlurmctld, ResumeProgram,
SuspendProgram and ResumeFailProgram:

    spotbag_hook.py CONFIG EVENT [HOSTLIST]

CONFIG is a JSON file: {"url", "secret_file", "spool_dir", "timeout_s",
"slurm_conf", "bin_dir", "pool_partitions", "power_up_wait_s"}. slurmctld runs hooks
with an empty environment (no PATH, no SLURM_CONF), so everything comes from there.

Each event is one JSON body, POSTed to URL/v1/slurm/events with
X-Spotbag-Timestamp (epoch seconds) and X-Spotbag-Signature:
sha256=HMAC-SHA256(secret, timestamp + "." + body); the secret is the file's
content, readable by SlurmUser only. When the controller cannot be reached (or
answers 5xx or 401), the event is spooled (written, then renamed into SPOOL_DIR) and
the hook exits 0; each run first sends what is spooled, oldest first, under a lock.
A hook never fails: slurmctld requeues or cancels a job whose PrologSlurmctld exits
non-zero.

The PrologSlurmctld of a job on a power-saving pool also waits until its nodes are
up: Slurm would otherwise start such a job only on its 30 s timer.

Standard library only, and only what starts fast (no urllib: it costs ~50 ms).
"""

import fcntl
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
import uuid

EVENTS = ("jobcomp", "prolog_slurmctld", "epilog_slurmctld", "resume", "suspend", "resume_fail")


def _env(name, default=""):
    return os.environ.get(name, default)


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def build_event(event, argv):
    """The event's body from what slurmctld put in the environment (and argv)."""
    body = {"event": event, "event_id": uuid.uuid4().hex, "sent_at": time.time()}
    if event == "jobcomp":
        body.update(
            cluster=_env("CLUSTER"),
            job_id=_env("JOBID"),
            job_name=_env("JOBNAME"),
            state=_env("JOBSTATE"),
            exit_code=_env("EXITCODE"),
            nodes=_env("NODES"),
            partition=_env("PARTITION"),
            user=_env("USERNAME"),
            account=_env("ACCOUNT"),
            cpus=_number(_env("PROCS")),
            submit=_number(_env("SUBMIT")),
            start=_number(_env("START")),
            end=_number(_env("END")),
        )
    elif event in ("prolog_slurmctld", "epilog_slurmctld"):
        body.update(
            cluster=_env("SLURM_CLUSTER_NAME"),
            job_id=_env("SLURM_JOB_ID"),
            job_name=_env("SLURM_JOB_NAME"),
            restart_count=int(_number(_env("SLURM_JOB_RESTART_COUNT")) or 0),
            nodes=_env("SLURM_JOB_NODELIST"),
            partition=_env("SLURM_JOB_PARTITION"),
            user=_env("SLURM_JOB_USER"),
            account=_env("SLURM_JOB_ACCOUNT"),
            cpus=_number(_env("SLURM_JOB_CPUS_PER_NODE").split("(")[0]),
            exit_code=_env("SLURM_JOB_EXIT_CODE2"),
        )
    else:  # resume, suspend, resume_fail: the nodes are argv[0]
        body["nodes"] = argv[0] if argv else ""
        resume_file = _env("SLURM_RESUME_FILE")
        if event == "resume" and resume_file:
            try:
                with open(resume_file, encoding="utf-8") as f:
                    body["resume"] = json.load(f)
            except (OSError, ValueError):
                pass
    return body


def sign(secret, body):
    timestamp = str(int(time.time()))
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return timestamp, "sha256=" + digest


def post(config, secret, body):
    """POST one body; returns the HTTP status (0 when there was no answer)."""
    url = config["url"].rstrip("/")
    if not url.startswith("http://"):
        raise ValueError("url must be http://host:port (the controller on the head node)")
    hostport = url[len("http://") :].split("/", 1)[0]
    host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "80")
    host = host.strip("[]")
    timestamp, signature = sign(secret, body)
    request = (
        "POST /v1/slurm/events HTTP/1.1\r\n"
        f"Host: {hostport}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"X-Spotbag-Timestamp: {timestamp}\r\n"
        f"X-Spotbag-Signature: {signature}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    try:
        with socket.create_connection(
            (host, int(port)), timeout=float(config.get("timeout_s", 2))
        ) as conn:
            conn.sendall(request)
            answer = b""
            while b"\r\n" not in answer:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                answer += chunk
    except OSError:
        return 0
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def delivered(status):
    """True when the controller took the event (or refused it for good: a malformed
    event does not get better by waiting)."""
    return 200 <= status < 300 or status in (400, 404, 409, 413, 422)


def spool(config, body):
    directory = config["spool_dir"]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}.json"
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(directory, name))


def deliver(config, secret, body):
    """Send what is spooled (oldest first), then `body`; spool whatever does not go
    through. Returns True when `body` was delivered."""
    directory = config["spool_dir"]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in sorted(n for n in os.listdir(directory) if n.endswith(".json")):
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    spooled = f.read()
            except OSError:
                continue
            if not delivered(post(config, secret, spooled)):
                spool(config, body)  # keep the order: this one after those
                return False
            os.unlink(path)
        if delivered(post(config, secret, body)):
            return True
        spool(config, body)
        return False


def wait_for_power_up(config, nodes):
    """Until no node of `nodes` is powering up or down (sinfo's '#' and '~'), or the
    configured wait runs out."""
    sinfo = os.path.join(config.get("bin_dir") or "/usr/bin", "sinfo")
    env = {"PATH": "/usr/bin:/bin"}
    if config.get("slurm_conf"):
        env["SLURM_CONF"] = config["slurm_conf"]
    deadline = time.monotonic() + float(config.get("power_up_wait_s", 600))
    while time.monotonic() < deadline:
        try:
            states = subprocess.run(
                [sinfo, "-h", "-N", "-n", nodes, "-o", "%T"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            return
        if states and not any(s.endswith(("#", "~")) for s in states):
            return
        time.sleep(0.2)


def main(argv):
    if len(argv) < 3 or argv[2] not in EVENTS:
        sys.stderr.write(f"usage: {argv[0]} CONFIG {{{'|'.join(EVENTS)}}} [HOSTLIST]\n")
        return 0  # never fail slurmctld's hook
    try:
        with open(argv[1], encoding="utf-8") as f:
            config = json.load(f)
        with open(config["secret_file"], "rb") as f:
            secret = f.read().strip()
        event = argv[2]
        body = build_event(event, argv[3:])
        deliver(config, secret, json.dumps(body, separators=(",", ":")).encode())
        if event == "prolog_slurmctld" and body.get("partition") in config.get(
            "pool_partitions", ()
        ):
            wait_for_power_up(config, body["nodes"])
    except Exception as exc:  # report, never fail: a failing prolog requeues the job
        sys.stderr.write(f"spotbag hook: {type(exc).__name__}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
