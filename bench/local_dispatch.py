#!/usr/bin/env python3
"""Benchmark: dispatching a bag of trivial jobs on 4 local slots, against `xargs -P4`.

One real daemon (local driver, local executor) with one VM type of 4 CPUs and
`max_vms = 1`: 4 slots for jobs of 1 CPU. A small bag first brings the VM up (it
stays up: a long idle timeout), so what is timed is dispatch alone. Then, alternating
in the same run (ROUNDS each, this shared host's load varies from one to the next):

1. spotbag: a bag of N jobs of `echo {i}`, timed from sending the submission until the
   daemon recorded that the bag succeeded (the bag's `finished_at`, by the same host's
   clock). The time until this client saw it, polling the bag every POLL_S, is printed
   too: up to POLL_S later, the poll's choice, not the daemon's.
2. xargs: `xargs -P4` running the same N commands, each as `sh -c 'echo i'` (a job's
   command is a shell command line), output appended to a file as a job's log is.

Prints each round's milliseconds per job, the medians and their ratio beside the
target, the CPU time the daemon process spent per job (its own, from
/proc/<pid>/stat, polls of the status included; its reaped children apart), and the
host's load (`uptime`). Target (issue 24): spotbag <= 2x xargs's wall time.

The daemon's state directory, where the jobs' logs go, and xargs's log are in a new
temporary directory, under TMPDIR if set, else on tmpfs (/dev/shm) where there is one
(`state_parent`): the filesystem it is on is printed, since every job creates files
there (`filesystem_of`). `TMPDIR=/tmp` measures on /tmp's.

`--profile FILE` records the daemon with py-spy (if installed) during the spotbag
rounds: a flame graph (SVG) or, for FILE ending in .txt, collapsed stacks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import against
from tee import Tee

from tests.conftest import Daemon

N_JOBS = 2000
SLOTS = 4
ROUNDS = 3
POLL_S = 0.1
TARGET_RATIO = 2.0
RESULTS = Path(__file__).resolve().parent / "results" / "local_dispatch.txt"

CONFIG = f"""
[api]
host = "127.0.0.1"
port = 0
token = "bench"

[scheduler]
max_vms = 1
idle_timeout_s = 3600.0

[driver]
name = "local"
boot_delay_s = 0.1

[[vm_types]]
name = "local-{SLOTS}"
cpus = {SLOTS}
memory_gb = {4 * SLOTS}.0
spot_price_per_hour = 0.04
on_demand_price_per_hour = 0.16
zone = "local"
"""

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its reaped children's), from /proc/<pid>/stat:
    utime + stime, and cutime + cstime (proc(5), fields 14-17)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, field 3 on
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime) / CLOCK_TICKS, (cutime + cstime) / CLOCK_TICKS


def bag_spec(n: int) -> dict:
    return {
        "account": "bench",
        "command": "echo {i}",
        "parameters": {"i": {"range": [0, n]}},
        "resources": {"cpus": 1, "memory_gb": 0.5},
        "max_runtime_s": 60,
    }


def run_bag(client, n: int) -> tuple[float, float]:
    """Seconds from submitting a bag of n jobs until the daemon recorded that it
    succeeded, and until this client saw it (polling)."""
    began, began_at = time.perf_counter(), time.time()
    bag = client.submit(bag_spec(n))
    while True:
        view = client.bag(bag["id"])
        if view["state"] != "active":
            break
        time.sleep(POLL_S)
    seen = time.perf_counter() - began
    if view["state"] != "succeeded":
        raise SystemExit(f"bag {bag['id']} ended {view['state']}: {view['counts']}")
    return view["finished_at"] - began_at, seen


def run_xargs(n: int, work: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) `xargs -P4` takes over the same n commands, each under its
    own sh: the CPU is xargs's and its shells' (reaped by it, so in its rusage)."""
    commands = "".join(f"echo {i}\n" for i in range(n)).encode()
    out = work / "xargs.log"
    out.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    with out.open("ab") as log:
        subprocess.run(
            ["xargs", f"-P{SLOTS}", "-d", "\\n", "-n1", "sh", "-c"],
            input=commands,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert len(out.read_bytes().splitlines()) == n
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu


def passes(client) -> tuple[int, float]:
    """(scheduler passes so far, seconds they took), from the daemon's /metrics."""
    text = client.request("GET", "/metrics", raw=True)[0].decode()
    count = total_s = 0.0
    for line in text.splitlines():
        if line.startswith("spotbag_scheduler_loop_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("spotbag_scheduler_loop_seconds_sum"):
            total_s = float(line.split()[-1])
    return int(count), total_s


def state_parent() -> str | None:
    """Where the daemon's state directory goes: under TMPDIR if set, else under /dev/shm
    (tmpfs) where there is one, else the default temporary directory. What is timed is
    dispatch, not a disk: on this kind of sandbox /tmp is ext4 without a journal, whose
    file creations slow down after many deletions (`filesystem_of`), so that a run on it
    after other benchmarks measures those (bench/README.md)."""
    if os.environ.get("TMPDIR"):
        return None
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def filesystem_of(path: Path) -> str:
    """`ext4 at / (/dev/vda, no journal)`: the filesystem `path` is on, from /proc/mounts.
    It weighs here: every job creates files (its log, exit status and checkpoint
    directory), and ext4 without a journal skips, one by one, the inodes freed in the
    last 5-300 s each time it allocates one (kernel: fs/ext4/ialloc.c recently_deleted),
    so that a run after thousands of files were deleted costs much more CPU a job."""
    best = ("", "", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, fstype = line.split()[:3]
        inside = str(path).startswith(mount.rstrip("/") + "/") or str(path) == mount
        if inside and len(mount) >= len(best[1]):
            best = (device, mount, fstype)
    device, mount, fstype = best
    journal = ""
    if fstype == "ext4":
        task = Path("/sys/fs/ext4") / Path(device).name / "journal_task"
        with contextlib.suppress(OSError):
            journal = ", no journal" if task.read_text().strip() == "<none>" else ", journal"
    return f"{fstype} at {mount} ({device}{journal})"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def profiler(pid: int, path: Path) -> subprocess.Popen | None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: no profile", file=sys.stderr)
        return None
    fmt = "raw" if path.suffix == ".txt" else "flamegraph"
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(pid), "--rate", "250", "--format", fmt, "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=N_JOBS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--profile", type=Path, help="py-spy output for the daemon")
    parser.add_argument("--log", type=Path, help="keep the daemon's log there")
    args = parser.parse_args()
    n = args.jobs

    out = Tee(sys.stdout)
    load_before = uptime()
    spotbag_s: list[float] = []  # until the daemon recorded the bag's end
    seen_s: list[float] = []  # until this client saw it
    xargs_s: list[float] = []
    daemon_cpu_s = children_cpu_s = xargs_cpu_s = 0.0
    passes_run, passes_s = 0, 0.0
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-dispatch-", dir=state_parent()) as tmp:
        state = Path(tmp)
        state_fs = filesystem_of(state.resolve())
        (state / "spotbag.toml").write_text(CONFIG)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        spy = None
        try:
            run_bag(client, SLOTS)  # the VM boots and stays
            assert daemon.process is not None
            pid = daemon.process.pid
            if args.profile:
                spy = profiler(pid, args.profile.resolve())
            for _ in range(args.rounds):
                own0, children0 = cpu_s(pid)
                passes0 = passes(client)
                recorded, seen = run_bag(client, n)
                spotbag_s.append(recorded)
                seen_s.append(seen)
                own1, children1 = cpu_s(pid)
                passes1 = passes(client)
                passes_run += passes1[0] - passes0[0]
                passes_s += passes1[1] - passes0[1]
                daemon_cpu_s += own1 - own0
                children_cpu_s += children1 - children0
                took, cpu = run_xargs(n, state)
                xargs_s.append(took)
                xargs_cpu_s += cpu
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            daemon.stop()
            if args.log:
                shutil.copy(daemon.log_path, args.log)
    load_after = uptime()

    def ms(seconds: float) -> float:
        return 1000 * seconds / n

    print(
        f"{n:,} jobs of `echo {{i}}` on {SLOTS} local slots, {args.rounds} rounds alternated",
        file=out,
    )
    print(
        "spotbag ms/job by round: "
        + ", ".join(f"{ms(s):.2f}" for s in spotbag_s)
        + " (until the daemon recorded the bag's end; until this client's poll saw it: "
        + ", ".join(f"{ms(s):.2f}" for s in seen_s)
        + ")",
        file=out,
    )
    print("xargs   ms/job by round: " + ", ".join(f"{ms(s):.2f}" for s in xargs_s), file=out)
    spotbag_ms, xargs_ms = ms(statistics.median(spotbag_s)), ms(statistics.median(xargs_s))
    ratio = spotbag_ms / xargs_ms
    print(
        f"median: spotbag {spotbag_ms:.2f} ms/job, xargs -P{SLOTS} {xargs_ms:.2f} ms/job: "
        f"{ratio:.2f}x {against(ratio, TARGET_RATIO, 'x xargs')}",
        file=out,
    )
    jobs_run = n * args.rounds
    print(
        f"daemon CPU: {1000 * daemon_cpu_s / jobs_run:.2f} ms/job of its own "
        f"(+ {1000 * children_cpu_s / jobs_run:.2f} ms/job in the job processes it reaped)",
        file=out,
    )
    # What the CPU time alone allows: a run can be no shorter than its CPU time spread
    # over every CPU of the host, however well the daemon overlaps with its jobs.
    cpus = os.cpu_count() or 1
    spotbag_cpu_ms = 1000 * (daemon_cpu_s + children_cpu_s) / jobs_run
    floor_ms = spotbag_cpu_ms / cpus
    daemon_allowed_ms = TARGET_RATIO * xargs_ms * cpus - 1000 * children_cpu_s / jobs_run
    print(
        f"CPU a job: spotbag {spotbag_cpu_ms:.2f} ms (daemon and jobs), xargs "
        f"{1000 * xargs_cpu_s / jobs_run:.2f} ms (xargs and its shells); spread over {cpus} "
        f"CPUs, spotbag's alone takes {floor_ms:.2f} ms a job = {floor_ms / xargs_ms:.2f}x "
        f"xargs's wall time at best: {TARGET_RATIO:g}x needs the daemon's own CPU at most "
        f"{daemon_allowed_ms:.2f} ms a job here, with jobs as costly",
        file=out,
    )
    print(
        f"scheduler passes: {passes_run / jobs_run:.2f} a job, "
        f"{1000 * passes_s / max(1, passes_run):.2f} ms each (their own time, store writes included)",
        file=out,
    )
    print(f"state directory on {state_fs}", file=out)
    print(f"load before: {load_before}", file=out)
    print(f"load after:  {load_after}", file=out)
    if args.jobs == N_JOBS and args.rounds == ROUNDS and not args.profile:
        RESULTS.write_text("".join(out.parts))


if __name__ == "__main__":
    main()
