#!/bin/bash
# spotbag node bootstrap (EC2 user data). Rendered by drivers/aws.py: every $$name
# below is replaced by a shell-quoted value. Runs once, as root, at first boot.
set -euo pipefail

install -d -m 0755 /etc/spotbag
cat > /etc/spotbag/node.env <<'NODE'
SPOTBAG_TOKEN=$token
SPOTBAG_CONTROLLER_ID=$controller_id
SPOTBAG_CONTROLLER_URL=$controller_url
SPOTBAG_VM_TYPE=$vm_type
NODE
chmod 0644 /etc/spotbag/node.env

# Joining the cluster: an image built for spotbag ships /usr/local/lib/spotbag/join,
# which reads /etc/spotbag/node.env (the Slurm integration starts slurmd there).
if [ -x /usr/local/lib/spotbag/join ]; then
    /usr/local/lib/spotbag/join
fi
