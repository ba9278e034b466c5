#!/usr/bin/env bash
# `make demo`: start the daemon on a temporary state directory with the local
# driver, submit the example bag (40 real jobs), watch it to the end through
# compressed preemptions, print the summary, and stop the daemon. On a terminal it
# first keeps the daemon up until Enter, so the web UI can be looked at
# (`--no-wait`, or SPOTBAG_DEMO_WAIT=0, stops at once).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE_DIR=$(mktemp -d -t spotbag-demo-XXXXXX)
export SPOTBAG_STATE_DIR="$STATE_DIR"
unset SPOTBAG_URL SPOTBAG_TOKEN

echo "== starting the daemon: local driver, state in $STATE_DIR"
spotbag serve --config examples/demo.toml >"$STATE_DIR/daemon.log" 2>&1 &
DAEMON=$!
stop_daemon() {
    if kill -0 "$DAEMON" 2>/dev/null; then
        echo "== stopping the daemon"
        kill -TERM "$DAEMON"
        wait "$DAEMON" || true
    fi
}
trap stop_daemon EXIT

not_ready() {
    if kill -0 "$DAEMON" 2>/dev/null; then
        why="the daemon runs but says it cannot work"
    else
        status=0
        wait "$DAEMON" || status=$?
        why="the daemon exited with status $status before it was ready"
    fi
    echo "error: $why; its log ($STATE_DIR/daemon.log):" >&2
    cat "$STATE_DIR/daemon.log" >&2
    exit 1
}

# Ready is what the daemon says, not a count of seconds (a busy machine makes its start
# slow): it writes api.url once it listens, then answers GET /healthz "starting" until
# its scheduler runs (docs/operations.md#healthz), which `spotbag health --wait` waits for.
until [ -s "$STATE_DIR/api.url" ]; do
    kill -0 "$DAEMON" 2>/dev/null || not_ready
    sleep 0.1
done
URL=$(cat "$STATE_DIR/api.url")
echo "   listening on $URL; loading"
spotbag health --wait >/dev/null || not_ready
echo "   ready"
echo "   the web UI: $URL/ (log in with the token in $STATE_DIR/token)"

echo "== submitting examples/logistic-sweep.yaml (checkpointable jobs; VMs die like Google n1-highcpu-16"
echo "   spot VMs, with 24 model hours = 1 real minute)"
BAG=$(spotbag submit --quiet examples/logistic-sweep.yaml)
spotbag watch "$BAG"

echo "== the first jobs:"
spotbag jobs "$BAG" --limit 5
echo "== the database and every job's log stay in $STATE_DIR (logs: $STATE_DIR/logs/$BAG/)"

if [ -t 0 ] && [ "${1:-}" != "--no-wait" ] && [ "${SPOTBAG_DEMO_WAIT:-1}" != 0 ]; then
    read -r -p "== the web UI stays at $URL/ until you press Enter " _
fi
