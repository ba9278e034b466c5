"""deploy/spotbag.service: systemd accepts it, it is hardened, and it fits the daemon.

systemd is not PID 1 in test environments, so the unit cannot be started; these tests
use `systemd-analyze verify` / `security --offline=yes`, which read unit files offline
(skipped when systemd-analyze is missing). Facts about systemd 252 (Debian 12) these
tests rely on, checked by hand:

- verify exits 1 only for hard errors such as a non-executable ExecStart. A bad value
  ("Failed to parse service type, ignoring: bogus") or an unknown key ("Unknown key
  'ProtectSytem' ..., ignoring") is only a line on stderr with exit status 0, so the
  tests also fail on any stderr line naming the unit, and negative controls prove
  that this check catches such mistakes.
- verify does not check that User=/Group= exist, so User=spotbag is left as it is
  even where no spotbag user exists. It does require ExecStart's binary to exist and
  be executable, hence the copy pointing at this venv's spotbag script.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from controller.cli import cli
from controller.config import ApiConfig, ExecutorConfig

pytestmark = pytest.mark.processes  # real processes: left out of make test-fast

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "spotbag.service"
INSTALLED_EXEC = "/opt/spotbag/venv/bin/spotbag"
SERVE_ARGS = "serve --config /etc/spotbag/spotbag.toml"

# Measured with systemd 252: "Overall exposure level for spotbag.service: 1.5 OK".
# The rest of the score is what the daemon and its jobs need: network access (no
# PrivateNetwork/IPAddressDeny), no MemoryDenyWriteExecute, ProtectHome=read-only,
# no PrivateUsers, no ProcSubset=pid (see the comments in the unit).
MAX_EXPOSURE = 1.8

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not on PATH"
)


def unit_settings(text: str) -> dict[str, list[str]]:
    """Key -> values (in order) over all sections; enough for this flat unit."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def local_exec_start() -> str:
    """ExecStart= value that exists on this machine (verify insists on an executable)."""
    bindir = os.path.dirname(sys.executable)
    script = shutil.which("spotbag", path=bindir)
    # No console script (package not installed): cli.py has a __main__ guard.
    command = (
        f"{script} {SERVE_ARGS}" if script else f"{sys.executable} -m controller.cli {SERVE_ARGS}"
    )
    if any(ch.isspace() for ch in script or sys.executable):
        pytest.skip(f"venv path contains whitespace, not worth quoting for systemd: {bindir}")
    return command


def unit_copy(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    """The unit with ExecStart made local, plus (regex, replacement) edits, in tmp_path."""
    text = UNIT.read_text()
    text, n = re.subn(r"(?m)^ExecStart=.*$", f"ExecStart={local_exec_start()}", text)
    assert n == 1, "the unit must have exactly one ExecStart="
    for pattern, replacement in replacements:
        text, n = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert n == 1, f"{pattern!r} must match exactly once in the unit"
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


def run_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, env=env, timeout=60
    )


def verify_problems(path: Path) -> tuple[int, list[str]]:
    """verify's exit status and its stderr lines about this unit (silent when all is well)."""
    result = run_analyze("verify", "--man=no", str(path))
    lines = [line for line in result.stderr.splitlines() if path.name in line]
    return result.returncode, lines


# --- no systemd needed -----------------------------------------------------------------


def test_unit_runs_the_installed_daemon_as_documented() -> None:
    settings = unit_settings(UNIT.read_text())
    assert settings["ExecStart"] == [f"{INSTALLED_EXEC} {SERVE_ARGS}"]
    # The options the unit passes exist: `spotbag serve --config PATH`.
    serve = cli.get_command(click.Context(cli), "serve")  # loaded lazily
    assert isinstance(serve, click.Command)
    assert any("--config" in p.opts for p in serve.params)
    assert settings["User"] == ["spotbag"]
    assert settings["StateDirectory"] == ["spotbag"]
    assert settings["EnvironmentFile"] == ["-/etc/spotbag/spotbag.env"]


def test_stop_lets_the_daemon_stop_its_jobs() -> None:
    settings = unit_settings(UNIT.read_text())
    assert settings["KillSignal"] == ["SIGTERM"]
    assert settings["KillMode"] == ["mixed"]
    timeout_s = float(settings["TimeoutStopSec"][0])
    grace_s = ExecutorConfig().kill_grace_s
    assert timeout_s >= grace_s + 10, (
        f"TimeoutStopSec={timeout_s:g} leaves too little room after kill_grace_s={grace_s:g}"
    )


def test_the_descriptor_limit_holds_every_connection_and_the_reserve() -> None:
    """Under systemd's default soft limit (1,024) slow clients took every descriptor
    (issue 23); the unit's limit must hold the default connection cap and the
    descriptors the daemon keeps for its own work, with room to spare."""
    settings = unit_settings(UNIT.read_text())
    limit = int(settings["LimitNOFILE"][0])  # one number: soft and hard alike
    api = ApiConfig()
    assert limit >= 4 * (api.max_connections + api.reserved_fds)


def test_no_settings_that_break_the_daemon_or_its_jobs() -> None:
    settings = unit_settings(UNIT.read_text())
    # W^X memory breaks ctypes/libffi closures and JITs; /proc subset=pid hides
    # /proc/meminfo etc.; ptraceable /proc is needed for kill_orphans (same uid).
    assert "MemoryDenyWriteExecute" not in settings
    assert "ProcSubset" not in settings
    assert settings.get("ProtectProc", ["default"]) in (["default"], ["invisible"])
    # Another state directory would be read-only under ProtectSystem=strict.
    assert "SPOTBAG_STATE_DIR" not in " ".join(settings.get("Environment", []))


# --- systemd-analyze -------------------------------------------------------------------


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    path = unit_copy(tmp_path)
    code, problems = verify_problems(path)
    assert code == 0 and not problems, "\n".join(problems) or f"exit status {code}"


@needs_systemd_analyze
@pytest.mark.parametrize(
    ("pattern", "replacement"),
    [
        (r"^Type=notify$", "Type=bogus"),  # a bad value: exit 0, one stderr line
        (r"^ProtectSystem=", "ProtectSytem="),  # a typo in a key: exit 0, one stderr line
        (r"^StateDirectory=spotbag$", "StateDirectory=/abs/path"),  # must be relative
    ],
    ids=["bad-value", "unknown-key", "invalid-path"],
)
def test_verify_check_catches_broken_units(tmp_path: Path, pattern: str, replacement: str) -> None:
    """Negative controls: the check in the test above fails on these mistakes."""
    path = unit_copy(tmp_path, (pattern, replacement))
    code, problems = verify_problems(path)
    assert code != 0 or problems, "systemd-analyze verify did not notice the broken unit"


@needs_systemd_analyze
def test_verify_check_catches_a_missing_binary(tmp_path: Path) -> None:
    """The unit as installed points at /opt/spotbag; absent here, verify must fail."""
    path = tmp_path / UNIT.name
    shutil.copy(UNIT, path)
    if Path(INSTALLED_EXEC).exists():
        pytest.skip(f"{INSTALLED_EXEC} exists on this machine")
    code, problems = verify_problems(path)
    assert code != 0
    assert any("not executable" in line for line in problems), problems


@needs_systemd_analyze
def test_hardening_exposure_stays_low(tmp_path: Path) -> None:
    path = unit_copy(tmp_path)
    result = run_analyze("security", "--offline=yes", "--no-pager", str(path))
    if result.returncode != 0 and "offline" in result.stderr.lower():
        pytest.skip(f"systemd-analyze security --offline unsupported: {result.stderr.strip()}")
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, f"no exposure score in output:\n{result.stdout}\n{result.stderr}"
    score = float(match.group(1))
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE}:\n{result.stdout}"
