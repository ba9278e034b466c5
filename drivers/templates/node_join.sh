# spotbag: join the Slurm cluster as the node /etc/spotbag/node.env names.
#
# The second half of every VM's boot script (drivers/bootstrap.py); an image may also
# ship it as /usr/local/lib/spotbag/join. It runs as root, once per boot, and may run
# again (it leaves a node that already runs alone).
#
# What the image needs: bash, python3, and, if they are missing, apt-get to install
# slurmd and munge (plus python3-boto3 for a munge key in AWS's secret stores, and
# nfs-common for a shared directory). Baking them in saves about a minute per boot.
#
# The munge key is the cluster's root credential. It is fetched here with the VM's
# own role from the secret store SPOTBAG_MUNGE_KEY names, never carried in user data:
#   aws-secretsmanager:NAME   SecretBinary, or SecretString holding the key in base64
#   aws-ssm:NAME              a SecureString parameter holding the key in base64
#   gcp-secretmanager:projects/P/secrets/S/versions/V   the key's bytes as the payload
#   file:PATH                 a file already on the VM (an image with the key baked in,
#                             or the local driver's VM hosts, which share the head's disk)

set -euo pipefail
# What this starts (munged, slurmd: its configless cache is what jobs' Slurm commands
# read, as the jobs' users) gets the usual umask, whatever the caller's.
umask 022
set -a
. /etc/spotbag/node.env
set +a

say() { echo "spotbag-join: $*" >&2; }

if [ -z "${SPOTBAG_SLURM_NODE:-}" ]; then
    say "no Slurm node named in /etc/spotbag/node.env: nothing to join"
    exit 0
fi
MUNGE_DEFAULT_SOCKET=/run/munge/munge.socket.2

systemd_runs() { [ -d /run/systemd/system ]; }

retry() {  # retry CMD...: boot-time networks and metadata servers take a moment
    local n=0
    until "$@"; do
        n=$((n + 1))
        if [ "$n" -ge 10 ]; then return 1; fi
        sleep $((n < 5 ? n : 5))
    done
}

install_missing() {
    local missing=()
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v munged >/dev/null || missing+=(munge)
    case "${SPOTBAG_MUNGE_KEY:-}" in
        aws-*) python3 -c 'import boto3' 2>/dev/null || missing+=(python3-boto3) ;;
    esac
    if [ -n "${SPOTBAG_SHARED_MOUNT:-}" ] && ! command -v mount.nfs >/dev/null; then
        missing+=(nfs-common)
    fi
    if [ "${#missing[@]}" -gt 0 ]; then
        say "installing ${missing[*]} (bake them into the image to boot faster)"
        if ! command -v apt-get >/dev/null; then
            say "no apt-get here: the image must provide ${missing[*]}"
            exit 1
        fi
        export DEBIAN_FRONTEND=noninteractive
        retry apt-get update -qq
        retry apt-get install -y -qq "${missing[@]}"
    fi
}

fetch_munge_key() {  # the key's bytes on stdout
    local source="${SPOTBAG_MUNGE_KEY:?SPOTBAG_MUNGE_KEY must say where the munge key is}"
    case "$source" in
        file:*)
            cat "${source#file:}"
            ;;
        aws-secretsmanager:* | aws-ssm:*)
            python3 - <<'PY'
import base64, os, sys
import boto3

kind, _, name = os.environ["SPOTBAG_MUNGE_KEY"].partition(":")
options = {"region_name": os.environ.get("SPOTBAG_AWS_REGION") or None}
if os.environ.get("SPOTBAG_AWS_ENDPOINT_URL"):
    options["endpoint_url"] = os.environ["SPOTBAG_AWS_ENDPOINT_URL"]
if kind == "aws-secretsmanager":
    answer = boto3.client("secretsmanager", **options).get_secret_value(SecretId=name)
    key = answer.get("SecretBinary") or base64.b64decode(answer["SecretString"])
else:
    answer = boto3.client("ssm", **options).get_parameter(Name=name, WithDecryption=True)
    key = base64.b64decode(answer["Parameter"]["Value"])
sys.stdout.buffer.write(key)
PY
            ;;
        gcp-secretmanager:*)
            python3 - <<'PY'
import base64, json, os, sys, urllib.request

name = os.environ["SPOTBAG_MUNGE_KEY"].partition(":")[2]
metadata = os.environ.get("SPOTBAG_GCE_METADATA_URL") or "http://metadata.google.internal/computeMetadata/v1"
api = os.environ.get("SPOTBAG_SECRETMANAGER_URL") or "https://secretmanager.googleapis.com"
ask = urllib.request.Request(
    metadata + "/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
)
token = json.load(urllib.request.urlopen(ask, timeout=10))["access_token"]
ask = urllib.request.Request(f"{api}/v1/{name}:access", headers={"Authorization": f"Bearer {token}"})
payload = json.load(urllib.request.urlopen(ask, timeout=10))["payload"]["data"]
sys.stdout.buffer.write(base64.b64decode(payload))
PY
            ;;
        *)
            say "unknown munge key source '${source%%:*}:' (aws-secretsmanager:, aws-ssm:, gcp-secretmanager:, file:)"
            return 1
            ;;
    esac
}

install_munge_key() {
    install -d -m 0700 /etc/munge
    # Private while it is written; what is started later keeps the script's umask.
    local umask_was
    umask_was=$(umask)
    umask 077
    retry fetch_munge_key >/etc/munge/munge.key.new
    if [ "$(wc -c </etc/munge/munge.key.new)" -lt 32 ]; then
        say "the munge key from ${SPOTBAG_MUNGE_KEY%%:*} is shorter than 32 bytes"
        exit 1
    fi
    chmod 0400 /etc/munge/munge.key.new
    mv /etc/munge/munge.key.new /etc/munge/munge.key
    umask "$umask_was"
    if id munge >/dev/null 2>&1 && systemd_runs; then
        chown -R munge:munge /etc/munge
    fi
}

start_munge() {
    # munged listens on its default socket: a configless slurmd fetches its config
    # through that one. A cluster whose slurm.conf names another (AuthInfo=socket=)
    # finds it there through a link.
    if systemd_runs; then
        systemctl enable munge >/dev/null 2>&1 || true
        systemctl restart munge
    else
        install -d -m 0711 "$(dirname "$MUNGE_DEFAULT_SOCKET")"
        install -d -m 0700 /var/lib/munge /var/log/munge
        munged --key-file=/etc/munge/munge.key --seed-file=/var/lib/munge/munged.seed \
            --log-file=/var/log/munge/munged.log
    fi
    local socket="${SPOTBAG_MUNGE_SOCKET:-$MUNGE_DEFAULT_SOCKET}"
    if [ "$socket" != "$MUNGE_DEFAULT_SOCKET" ]; then
        install -d -m 0711 "$(dirname "$socket")"
        ln -sf "$MUNGE_DEFAULT_SOCKET" "$socket"
    fi
}

mount_shared() {
    [ -n "${SPOTBAG_SHARED_MOUNT:-}" ] || return 0
    local where="${SPOTBAG_SHARED_DIR:?SPOTBAG_SHARED_DIR is where the shared directory goes}"
    install -d "$where"
    if ! mountpoint -q "$where"; then
        retry mount -t nfs -o hard,noatime "$SPOTBAG_SHARED_MOUNT" "$where"
    fi
}

add_user() {  # add_user NAME UID GID, unless the VM knows NAME already
    local name=$1 uid=$2 gid=$3
    id -u "$name" >/dev/null 2>&1 && return 0
    getent group "$gid" >/dev/null || groupadd -g "$gid" "$name"
    useradd -u "$uid" -g "$gid" -M -d / -s /usr/sbin/nologin "$name"
}

add_job_user() {
    # Jobs run as the daemon's user, or as their accounts' users (SPOTBAG_JOB_USERS:
    # "name:uid:gid ..."): slurmd must know them, by the same ids.
    if [ -n "${SPOTBAG_JOB_USER:-}" ]; then
        add_user "$SPOTBAG_JOB_USER" "${SPOTBAG_JOB_UID:?}" "${SPOTBAG_JOB_GID:?}"
    fi
    local entry name uid gid
    for entry in ${SPOTBAG_JOB_USERS:-}; do
        IFS=: read -r name uid gid <<<"$entry"
        add_user "$name" "$uid" "$gid"
    done
}

slurmd_args() {  # one argument per line
    printf '%s\n' -N "$SPOTBAG_SLURM_NODE" --conf-server "${SPOTBAG_SLURM_CONF_SERVER:?}"
    if [ "${SPOTBAG_SLURM_DYNAMIC:-0}" = 1 ]; then
        # A dynamic node: it brings its own description. Its memory is what the VM has,
        # at most the type's (Slurm drains a node that has less than it claims).
        local memory_mb
        memory_mb=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
        if [ -n "${SPOTBAG_MEMORY_MB:-}" ] && [ "$SPOTBAG_MEMORY_MB" -lt "$memory_mb" ]; then
            memory_mb=$SPOTBAG_MEMORY_MB
        fi
        local conf="CPUs=${SPOTBAG_CPUS:?} RealMemory=$memory_mb Feature=${SPOTBAG_SLURM_FEATURES:-spotbag}"
        if [ "${SPOTBAG_GPUS:-0}" -gt 0 ]; then conf="$conf Gres=gpu:$SPOTBAG_GPUS"; fi
        printf '%s\n' -Z --conf "$conf"
    fi
    # On a host that shares its kernel with the head node (the local driver's VM hosts),
    # the boot time slurmd reports predates the resume; -b reports this start as a boot.
    if [ "${SPOTBAG_SLURMD_REPORT_BOOT:-0}" = 1 ]; then printf '%s\n' -b; fi
}

start_slurmd() {
    local args=()
    mapfile -t args < <(slurmd_args)
    if systemd_runs; then
        local quoted="" arg
        for arg in "${args[@]}"; do quoted="$quoted \"${arg//\"/}\""; done
        install -d /etc/systemd/system/slurmd.service.d
        cat >/etc/systemd/system/slurmd.service.d/spotbag.conf <<UNIT
[Unit]
# Configless: slurm.conf comes from the head node, not from /etc/slurm.
ConditionPathExists=

[Service]
ExecStart=
ExecStart=/usr/sbin/slurmd -D -s$quoted
UNIT
        systemctl daemon-reload
        systemctl enable slurmd >/dev/null 2>&1 || true
        systemctl restart slurmd
    else
        install -d /var/spool/slurmd /var/log/slurm /run/slurm
        slurmd "${args[@]}"
    fi
}

start_notice_watch() {
    # The cloud's preemption notices, heard on the VM: the watcher the boot script wrote
    # beside node.env (drivers/templates/notice_watch.py) asks the metadata server and
    # drains this node with "spot notice: ends by T", which the controller reads. Only
    # spotbag's own (dynamic) nodes: a pool node is Slurm's, and a drain would outlive
    # its VM.
    case "${SPOTBAG_NOTICE_WATCH:-}" in aws | gce) ;; *) return 0 ;; esac
    [ "${SPOTBAG_SLURM_DYNAMIC:-0}" = 1 ] || return 0
    local watcher=/etc/spotbag/notice_watch.py
    if [ ! -f "$watcher" ]; then
        say "no $watcher: preemption notices are not watched on this VM"
        return 0
    fi
    if systemd_runs; then
        cat >/etc/systemd/system/spotbag-notice-watch.service <<UNIT
[Unit]
Description=spotbag: drain this Slurm node on a spot preemption notice
After=slurmd.service

[Service]
EnvironmentFile=/etc/spotbag/node.env
ExecStart=/usr/bin/python3 -I $watcher
Restart=on-failure
UNIT
        systemctl daemon-reload
        # The node is joined already: a watcher that cannot start costs only notices.
        systemctl restart spotbag-notice-watch || say "the notice watcher did not start"
    else
        setsid python3 -I "$watcher" </dev/null >>/var/log/spotbag-notice-watch.log 2>&1 &
    fi
}

slurmd_runs_here() {  # this node's slurmd, on this host: in this network namespace (the
    # local driver's VM hosts share one kernel's process table, and another cluster's
    # VM host may run a node of the same name)
    local pid here
    here=$(readlink /proc/self/ns/net)
    for pid in $(pgrep -f "slurmd.* -N $SPOTBAG_SLURM_NODE( |$)"); do
        [ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$here" ] && return 0
    done
    return 1
}

if slurmd_runs_here; then
    say "slurmd already runs as $SPOTBAG_SLURM_NODE"
    exit 0
fi
install_missing
add_job_user
install_munge_key
start_munge
mount_shared
start_slurmd
start_notice_watch
say "slurmd started as $SPOTBAG_SLURM_NODE (controller ${SPOTBAG_SLURM_CONF_SERVER})"
