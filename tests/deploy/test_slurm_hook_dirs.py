"""`spotbag slurm install-hooks` makes its directories with exact modes, whatever the
umask: the ones holding the hook secret, the hooks' config and the spool 0700 and
SlurmUser's, the hooks' own 0755, the parents it makes 0755 (SlurmUser passes through
them); an existing directory others may write to is refused, and so is one SlurmUser
cannot reach.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli


@pytest.fixture
def umask_0():
    """The worst umask: without exact modes, every directory would be world-writable."""
    old = os.umask(0)
    yield
    os.umask(old)


def owner() -> pwd.struct_passwd:
    """SlurmUser: another user than the caller when we may chown (root)."""
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())


def install(tmp_path: Path, *, state: Path, dest: Path, hook_config: Path, spool: Path):
    config = tmp_path / "spotbag.toml"
    config.write_text(
        f'state_dir = "{state}"\n[executor]\nname = "slurm"\n[slurm]\nmunge_key = "file:/k"\n'
    )
    return CliRunner().invoke(
        cli,
        [
            "slurm", "install-hooks", "--config", str(config), "--dest", str(dest),
            "--hook-config", str(hook_config), "--spool", str(spool),
            "--owner", owner().pw_name, "--python", "/usr/bin/python3",
        ],
    )  # fmt: skip


def mode_and_owner(path: Path) -> tuple[str, int]:
    st = path.stat()
    return oct(stat.S_IMODE(st.st_mode)), st.st_uid


@pytest.fixture
def top():
    """Stands for /: everything below it is made by install-hooks. Under /tmp, which
    SlurmUser may pass through (pytest's tmp_path is its caller's alone)."""
    made = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-hook-dirs-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def test_directories_holding_secrets_are_private_whatever_the_umask(tmp_path, top, umask_0):
    paths = {
        "state": top / "var" / "lib" / "spotbag",
        "dest": top / "usr" / "local" / "lib" / "spotbag" / "slurm-hooks",
        "hook_config": top / "etc" / "spotbag" / "slurm-hooks.json",
        "spool": top / "var" / "spool" / "spotbag-hooks",
    }
    result = install(tmp_path, **paths)
    assert result.exit_code == 0, result.output
    uid, me = owner().pw_uid, os.geteuid()
    # The daemon's state directory (its hook secret), the hooks' config and secret copy,
    # and the spool (signed events waiting): SlurmUser's alone.
    for private in (paths["state"], paths["hook_config"].parent, paths["spool"]):
        assert mode_and_owner(private) == ("0o700", uid), private
    # slurmctld runs what is in the hooks' directory: only root may write there.
    assert mode_and_owner(paths["dest"]) == ("0o755", me)
    for parent in (top / "var", top / "var" / "lib", top / "usr" / "local" / "lib", top / "etc"):
        assert mode_and_owner(parent) == ("0o755", me), parent
    secret = paths["state"] / "slurm-hook.secret"
    assert mode_and_owner(secret) == ("0o600", uid)
    copy = paths["hook_config"].with_name("slurm-hooks.secret")
    assert copy.read_bytes() == secret.read_bytes()
    assert mode_and_owner(copy) == ("0o600", uid)
    assert mode_and_owner(paths["hook_config"]) == ("0o600", uid)

    # Again (an upgrade): a spool someone opened up is closed again; all else stays.
    paths["spool"].chmod(0o777)
    result = install(tmp_path, **paths)
    assert result.exit_code == 0, result.output
    assert mode_and_owner(paths["spool"]) == ("0o700", uid)
    assert mode_and_owner(paths["state"]) == ("0o700", uid)


def test_an_existing_directory_others_may_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = install(
        tmp_path,
        state=tmp_path / "state",
        dest=tmp_path / "hooks",
        hook_config=shared / "slurm-hooks.json",
        spool=tmp_path / "spool",
    )
    assert result.exit_code != 0
    assert f"{shared} may be written by others" in result.output
    assert not (shared / "slurm-hooks.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another user than the caller: root")
def test_a_directory_slurm_user_cannot_reach_is_refused(tmp_path, top):
    """As /etc/spotbag (0750 root:spotbag) is to a SlurmUser outside group spotbag:
    its hooks could not read their config and would lose every event."""
    closed = top / "etc"
    closed.mkdir(mode=0o750)
    result = install(
        tmp_path,
        state=top / "state",
        dest=top / "hooks",
        hook_config=closed / "spotbag" / "slurm-hooks.json",
        spool=top / "spool",
    )
    assert result.exit_code != 0
    assert f"nobody (SlurmUser, who runs the hooks) cannot pass through {closed} " in (
        result.output
    )
    assert not (closed / "spotbag" / "slurm-hooks.json").exists()
