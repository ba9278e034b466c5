"""Who an account's jobs run as (`[executor] run_as`, `run_as_accounts`), for both the
local and the Slurm executor.

Accounts are kept apart on the job host by Unix users: with `run_as =
"spotbag-{account}"` (or a user per account in `run_as_accounts`) each account's jobs
run as a user of their own. What the daemon reads back of an attempt, its exit status
and its start marker, and its job's checkpoint directory are then that user's (0600,
0700), made by the daemon in directories only the daemon may write (0711); and the
kernel shows a process's environment (/proc/<pid>/environ, where the attempt ids are)
only to its own user. Another account's job can neither learn an attempt's id there
nor write its files. The daemon also believes such a file only when it is a regular
file owned by that attempt's user that nobody else may write (attempt_files.py
`read_owned`), so a layout gone wrong never makes a forged status count.

Accounts that share a user (one `run_as` user for all, the daemon's user when none is
set) are not isolated from each other: their jobs can read and write each other's
files and signal each other's processes.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass

from controller.errors import SpotbagError

ACCOUNT = "{account}"
# Users below this uid are the system's (daemons such as munge, whose rights a job must
# never get): a template never resolves to one. Not all are below it (Debian's slurm is
# 64030): the template's fixed part is what keeps account names from other users.
FIRST_REGULAR_UID = 1000
# Account names as bags may name them (controller/bags/spec.py ACCOUNT_NAME).
_ACCOUNT_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


@dataclass(frozen=True)
class JobUser:
    """An unprivileged user jobs run as."""

    name: str
    uid: int
    gid: int
    home: str = "/"


class JobUserError(SpotbagError):
    """An account's jobs have no user they may run as; the message says why and what
    would help."""


def template_problem(run_as: str) -> str | None:
    """Why `run_as` is not a user name or a template of one ("spotbag-{account}")."""
    if "{" in run_as.replace(ACCOUNT, "") or "}" in run_as.replace(ACCOUNT, ""):
        return f"only {ACCOUNT} may stand in braces (got {run_as!r})"
    if run_as.count(ACCOUNT) > 1:
        return f"{ACCOUNT} may stand once in it (got {run_as!r})"
    if run_as == ACCOUNT:
        return (
            f"{ACCOUNT} needs a fixed part beside it, e.g. spotbag-{ACCOUNT}: alone, account "
            "names would reach every user of the host"
        )
    if any(c.isspace() or c in ":/," for c in run_as):
        return f"a user name has no spaces, ':', '/' or ',' (got {run_as!r})"
    return None


class JobUsers:
    """The users accounts' jobs run as: `accounts[account]` if named there, else
    `run_as` with `{account}` replaced by the account's name. Neither set: jobs run as
    the daemon's own user (`for_account` returns None).

    A user is looked up afresh each time (an admin may create it after a bag was
    refused); it must exist and be neither root (uid or group 0) nor the daemon's own
    user (jobs would reach the daemon's files); one the template names must not be a
    system user (uid below FIRST_REGULAR_UID) either."""

    def __init__(
        self,
        run_as: str = "",
        accounts: Mapping[str, str] | None = None,
        *,
        daemon_uid: int | None = None,
    ) -> None:
        self.run_as = run_as
        self.accounts = dict(accounts or {})
        self.daemon_uid = os.geteuid() if daemon_uid is None else daemon_uid
        self._seen: dict[str, JobUser] = {}  # every user resolved since the start

    @property
    def configured(self) -> bool:
        return bool(self.run_as or self.accounts)

    @property
    def per_account(self) -> bool:
        """Whether no two accounts' jobs share a user: a template with {account}, and
        run_as_accounts naming each user once (an account the template would give one
        of those is refused)."""
        if not self.configured:
            return False
        named = list(self.accounts.values())
        if len(set(named)) != len(named):
            return False
        return not self.run_as or ACCOUNT in self.run_as

    def user_name(self, account: str) -> str:
        """The name (or uid) of the user `account`'s jobs run as; "" when none is set."""
        if account in self.accounts:
            return self.accounts[account]
        return self.run_as.replace(ACCOUNT, account)

    def for_account(self, account: str) -> JobUser | None:
        """The user `account`'s jobs run as, checked; None when jobs run as the daemon's
        user (nothing is configured). Raises JobUserError."""
        if not self.configured:
            return None
        name = self.user_name(account)
        if not name:
            raise JobUserError(
                f"account {account!r} has no user to run its jobs as: [executor] "
                "run_as_accounts does not name it and run_as is empty"
            )
        templated = account not in self.accounts
        whose = f"the jobs of account {account!r}"
        user = self.lookup(name, whose, templated=templated)
        if templated and user.name in self.accounts.values():
            raise JobUserError(
                f"{whose} would run as {user.name}, the user run_as_accounts gives to "
                f"{', '.join(sorted(a for a, u in self.accounts.items() if u == user.name))}"
            )
        self._seen[user.name] = user
        return user

    def lookup(self, name: str, whose: str, *, templated: bool = False) -> JobUser:
        """The user `name` (or a uid), if jobs may run as it (`templated`: named by the
        run_as template after an account). Raises JobUserError."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, OverflowError):
            raise JobUserError(
                f"{whose} run as user {name!r}, which does not exist on this host; an "
                f"admin creates it (useradd --user-group --no-create-home --shell "
                f"/usr/sbin/nologin {name})"
            ) from None
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise JobUserError(f"{whose} would run as {entry.pw_name}: jobs must not run as root")
        if entry.pw_uid == self.daemon_uid:
            raise JobUserError(
                f"{whose} would run as {entry.pw_name}, the daemon's own user: they could "
                "read and change its state"
            )
        if templated and ACCOUNT in self.run_as and entry.pw_uid < FIRST_REGULAR_UID:
            raise JobUserError(
                f"{whose} would run as {entry.pw_name}, a system user (uid {entry.pw_uid} < "
                f"{FIRST_REGULAR_UID}): run_as = {self.run_as!r} names only regular users; "
                "run_as_accounts may name another one"
            )
        return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/")

    def problem(self, account: str) -> str | None:
        """Why `account`'s jobs could not run (None when they can)."""
        try:
            self.for_account(account)
        except JobUserError as exc:
            return str(exc)
        return None

    def owner(self, account: str) -> int:
        """The uid whose files an attempt of `account` leaves are believed: its job
        user's, the daemon's when jobs run as the daemon's user, -1 (nobody's) when its
        user is gone."""
        try:
            user = self.for_account(account)
        except JobUserError:
            return -1
        return self.daemon_uid if user is None else user.uid

    def known(self) -> list[JobUser]:
        """The job users this host knows of, for VMs to create at boot: those of
        `run_as_accounts`, those resolved since the start, and every user whose name
        fits the `run_as` template."""
        found = dict(self._seen)
        candidates: list[str] = list(self.accounts.values())
        if self.run_as and ACCOUNT not in self.run_as:
            candidates.append(self.run_as)
        elif self.run_as:
            head, _, tail = self.run_as.partition(ACCOUNT)
            pattern = re.compile(re.escape(head) + _ACCOUNT_NAME + re.escape(tail))
            candidates += [e.pw_name for e in pwd.getpwall() if pattern.fullmatch(e.pw_name)]
        for name in candidates:
            if name in found:
                continue
            try:
                user = self.lookup(name, "jobs", templated=name not in self.accounts.values())
            except JobUserError:
                continue
            found[user.name] = user
        return sorted(found.values(), key=lambda u: u.uid)
