"""The script a new VM runs at first boot: EC2 user data, the GCE startup-script, or
what the local driver's VM hosts run (drivers/local_hosts.py).

The bundled script writes the VM's settings to /etc/spotbag/node.env (and, when they
ask for one, the notice watcher drivers/templates/notice_watch.py beside it) and runs
drivers/templates/node_join.sh, which, when they name a Slurm node, joins the
cluster: it
fetches the munge key from the cloud's secret store with the VM's own role (the key
never travels in user data or metadata), starts munged, mounts the head node's
shared directory if one is configured, starts slurmd as the node named after
the VM, and starts the notice watcher. See docs/slurm.md.

A custom template (a cloud's user_data_template) is rendered with string.Template:
`$node_env` becomes one `NAME='value'` line per setting, shell-quoted; `$token`,
`$controller_id`, `$controller_url` and `$vm_type` stay available. A placeholder the
renderer does not know is an error, not text left in the script.
"""

from __future__ import annotations

import base64
import functools
import re
import string
import zlib
from collections.abc import Mapping
from importlib import resources

SETTING_NAME = re.compile(r"SPOTBAG_[A-Z0-9_]+")


class BootstrapError(ValueError):
    """A template or a setting that cannot be rendered into a boot script."""


@functools.cache
def join_script() -> str:
    """The Slurm join step (drivers/templates/node_join.sh), static text."""
    return resources.files("drivers").joinpath("templates/node_join.sh").read_text()


@functools.cache
def notice_watcher() -> str:
    """The notice watcher node_join.sh starts (drivers/templates/notice_watch.py)."""
    return resources.files("drivers").joinpath("templates/notice_watch.py").read_text()


@functools.cache
def _packed_watcher() -> str:
    """The watcher compressed (zlib), in base64 lines of 76 characters."""
    packed = base64.b64encode(zlib.compress(notice_watcher().encode(), 9)).decode()
    return "\n".join(packed[i : i + 76] for i in range(0, len(packed), 76))


# The bundled boot script: settings, then the join step. Not a string.Template: the
# join step is plain bash, full of dollars.
_HEADER = """\
#!/bin/bash
# spotbag VM boot script (drivers/bootstrap.py): the VM's settings, then the Slurm
# join step (drivers/templates/node_join.sh). Runs as root at boot.
set -euo pipefail
install -d -m 0700 /etc/spotbag
(umask 077 && cat >/etc/spotbag/node.env) <<'SPOTBAG_NODE_ENV'
{node_env}
SPOTBAG_NODE_ENV
"""
# With SPOTBAG_NOTICE_WATCH (aws, gce): the watcher node_join.sh starts, as a file;
# compressed, as EC2 takes 16 KiB of user data (drivers/templates/notice_watch.py).
_WATCHER = """\
python3 -c 'import base64, sys, zlib; sys.stdout.buffer.write(zlib.decompress(base64.b64decode(sys.stdin.read())))' \\
    >/etc/spotbag/notice_watch.py <<'SPOTBAG_NOTICE_WATCH'
{watcher}
SPOTBAG_NOTICE_WATCH
"""


def shell_quote(value: str) -> str:
    """`value` as one word for sh, whatever it contains."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def node_env(settings: Mapping[str, str]) -> str:
    """The lines of /etc/spotbag/node.env: NAME='value', sorted by name."""
    lines = []
    for name in sorted(settings):
        if not SETTING_NAME.fullmatch(name):
            raise BootstrapError(f"bootstrap setting {name!r} is not SPOTBAG_[A-Z0-9_]+")
        value = settings[name]
        if "\n" in value or "\0" in value:
            raise BootstrapError(f"bootstrap setting {name} spans lines")
        lines.append(f"{name}={shell_quote(value)}")
    return "\n".join(lines)


def render(
    template: str | None, settings: Mapping[str, str], *, max_bytes: int | None = None
) -> str:
    """The boot script for one VM: the bundled one (`template` None) or a custom
    template. `settings` are SPOTBAG_* values; SPOTBAG_VM_ID, SPOTBAG_CONTROLLER_ID,
    SPOTBAG_CONTROLLER_URL and SPOTBAG_VM_TYPE also fill a template's older
    placeholders ($token, ...)."""
    if template is None:
        script = _HEADER.format(node_env=node_env(settings))
        # The watcher runs on spotbag's own Slurm nodes only (node_join.sh).
        if settings.get("SPOTBAG_NOTICE_WATCH") and settings.get("SPOTBAG_SLURM_DYNAMIC") == "1":
            script += _WATCHER.format(watcher=_packed_watcher())
        return _checked_size(script + join_script(), max_bytes)
    values = {
        "node_env": node_env(settings),
        "token": shell_quote(settings.get("SPOTBAG_VM_ID", "")),
        "controller_id": shell_quote(settings.get("SPOTBAG_CONTROLLER_ID", "")),
        "controller_url": shell_quote(settings.get("SPOTBAG_CONTROLLER_URL", "")),
        "vm_type": shell_quote(settings.get("SPOTBAG_VM_TYPE", "")),
    }
    try:
        rendered = string.Template(template).substitute(values)
    except (KeyError, ValueError) as exc:
        raise BootstrapError(f"boot script template: unknown or bad placeholder {exc}") from None
    return _checked_size(rendered, max_bytes)


def _checked_size(script: str, max_bytes: int | None) -> str:
    if max_bytes is not None and len(script.encode()) > max_bytes:
        raise BootstrapError(
            f"the boot script is {len(script.encode())} bytes; the cloud takes at most {max_bytes}"
        )
    return script
