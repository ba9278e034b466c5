#!/usr/bin/env python3
"""Lyapunov exponent of the logistic map x -> r·x·(1 - x), one value of r per job.

A small real computation for the demo bag, and an example of a checkpointable
job: it iterates the map in chunks, pacing itself to take about --seconds of wall
time (as a longer job would), and prints one line of JSON with the result.

Checkpoints: spotbag sends SIGUSR1 when this job should checkpoint. The handler
only sets a flag; the main loop writes its state at the end of the chunk it is in
(a consistent point), atomically: to a temporary file first, then renamed over
$SPOTBAG_CHECKPOINT_DIR/state.json, so a preemption mid-write never leaves a torn
checkpoint. The rename is also how spotbag sees that the checkpoint is complete.
A retry (on a new VM) finds the file and resumes where it left off.
"""

import argparse
import json
import math
import os
import signal
import time
from pathlib import Path

checkpoint_requested = False


def request_checkpoint(signum, frame) -> None:
    global checkpoint_requested
    checkpoint_requested = True


def save(path: Path, state: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as out:
        json.dump(state, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def main() -> None:
    global checkpoint_requested
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--r", type=float, required=True, help="growth rate, 0 < r <= 4")
    parser.add_argument("--x0", type=float, default=0.2, help="initial value in (0, 1)")
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="target wall time")
    parser.add_argument("--chunks", type=int, default=200, help="checkpointable points")
    parser.add_argument("--progress", action="store_true", help="print every chunk done")
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, request_checkpoint)

    checkpoint = Path(os.environ.get("SPOTBAG_CHECKPOINT_DIR", ".")) / "state.json"
    x, done, total = args.x0, 0, 0.0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        x, done, total = state["x"], state["done"], state["total"]
        print(f"resuming from iteration {done}", flush=True)

    per_chunk = max(1, args.iterations // args.chunks)
    resumed_at, started = done, time.monotonic()
    while done < args.iterations:
        for _ in range(min(per_chunk, args.iterations - done)):
            x = args.r * x * (1.0 - x)
            total += math.log(max(abs(args.r * (1.0 - 2.0 * x)), 1e-300))
        done = min(args.iterations, done + per_chunk)
        if args.progress:
            print(f"iteration {done}", flush=True)
        if checkpoint_requested:
            checkpoint_requested = False
            save(checkpoint, {"x": x, "done": done, "total": total})
            print(f"checkpoint at iteration {done}", flush=True)
        # Pace the job: the demo wants several seconds per job to show preemptions.
        target = started + args.seconds * (done - resumed_at) / args.iterations
        time.sleep(max(0.0, target - time.monotonic()))

    print(f"r={args.r} finished {args.iterations} iterations", flush=True)
    result = {
        "r": args.r,
        "lyapunov": total / args.iterations,
        "chaotic": total > 0,
        "attempt": int(os.environ.get("SPOTBAG_ATTEMPT", "1")),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
