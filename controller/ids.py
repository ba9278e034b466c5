"""Identifiers of bags and VMs: random for the daemon, sequential for simulations.

Bag ids look like `b3f9a0c21d7` (no dash: a job id is `<bag id>-<index>` and an
attempt id `<job id>.<number>`). A VM's id is the token it was launched with.
"""

from __future__ import annotations

import itertools
import re
import secrets

BAG_ID = re.compile(r"b[0-9a-f]{10}")  # use with fullmatch
JOB_ID = re.compile(r"(b[0-9a-f]{10})-(0|[1-9][0-9]{0,11})")  # use with fullmatch


class RandomIds:
    def new_bag_id(self) -> str:
        return "b" + secrets.token_hex(5)

    def new_vm_token(self) -> str:
        return "vm-" + secrets.token_hex(6)


class SequentialIds:
    """Deterministic ids for simulations (same seed, same ids)."""

    def __init__(self) -> None:
        self._bags = itertools.count(1)
        self._vms = itertools.count(1)

    def new_bag_id(self) -> str:
        return f"b{next(self._bags):010x}"

    def new_vm_token(self) -> str:
        return f"vm-{next(self._vms):012x}"
