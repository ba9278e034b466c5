#!/usr/bin/env python3
"""Lyapunov exponent of the logistic map x -> r·x·(1 - x), one value of r per job.

A small real computation for the demo bag: it iterates the map in chunks and
paces itself to take about --seconds of wall time (as a longer job would),
printing progress and finally one line of JSON with the result. It resumes
from a checkpoint in $SPOTBAG_CHECKPOINT_DIR when one exists.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--r", type=float, required=True, help="growth rate, 0 < r <= 4")
    parser.add_argument("--x0", type=float, default=0.2, help="initial value in (0, 1)")
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="target wall time")
    args = parser.parse_args()

    checkpoint = Path(os.environ.get("SPOTBAG_CHECKPOINT_DIR", ".")) / "state.json"
    x, done, total = args.x0, 0, 0.0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        x, done, total = state["x"], state["done"], state["total"]
        print(f"resuming from iteration {done}", flush=True)

    chunks = 10
    per_chunk = args.iterations // chunks
    started = time.monotonic()
    while done < args.iterations:
        for _ in range(per_chunk):
            x = args.r * x * (1.0 - x)
            total += math.log(max(abs(args.r * (1.0 - 2.0 * x)), 1e-300))
        done += per_chunk
        print(f"r={args.r} iteration {done}/{args.iterations}", flush=True)
        # Pace the job: the demo wants several seconds per job to show preemptions.
        target = started + args.seconds * done / args.iterations
        time.sleep(max(0.0, target - time.monotonic()))

    result = {
        "r": args.r,
        "lyapunov": total / args.iterations,
        "chaotic": total > 0,
        "attempt": int(os.environ.get("SPOTBAG_ATTEMPT", "1")),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
