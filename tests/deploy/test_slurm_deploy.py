"""deploy/ for the Slurm executor: the example head-node config is valid, the slurm.conf
fragment beside it is what `spotbag slurm conf` makes of it, the systemd drop-in is
accepted with the unit, and against the real test cluster `spotbag config check` says
what is ready (and what is not), `spotbag slurm install-hooks` installs working hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import cli
from controller.config import load_config
from tests.deploy.test_systemd_unit import (
    needs_systemd_analyze,
    unit_copy,
    unit_settings,
    verify_problems,
)

pytestmark = pytest.mark.processes  # real processes: left out of make test-fast

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def test_the_example_head_node_config_is_valid_and_its_fragment_current():
    config = load_config(DEPLOY / "spotbag-slurm.toml")
    assert (config.executor.name, config.driver.name) == ("slurm", "aws")
    result = CliRunner().invoke(
        cli, ["slurm", "conf", "--config", str(DEPLOY / "spotbag-slurm.toml")]
    )
    assert result.exit_code == 0, result.output
    assert result.output == (DEPLOY / "slurm.conf.spotbag").read_text(), (
        "regenerate deploy/slurm.conf.spotbag: "
        "spotbag slurm conf --config deploy/spotbag-slurm.toml > deploy/slurm.conf.spotbag"
    )
    assert "NodeName=spot-m5l-[0-31] CPUs=2 " in result.output
    assert "NodeSet=spotbag Feature=spotbag" in result.output


def test_a_pool_of_unknown_or_smaller_types_is_refused(tmp_path):
    config = tmp_path / "spotbag.toml"
    config.write_text(
        '[executor]\nname = "slurm"\n[[slurm.pools]]\npartition = "spot"\nnodes = "s[0-1]"\n'
        'vm_types = ["local-8", "local-2"]\n'
    )
    result = CliRunner().invoke(cli, ["slurm", "conf", "--config", str(config)])
    assert result.exit_code != 0 and "local-2 are smaller than local-8" in result.output
    config.write_text(config.read_text().replace('"local-8", "local-2"', '"nope"'))
    result = CliRunner().invoke(cli, ["slurm", "conf", "--config", str(config)])
    assert result.exit_code != 0 and "unknown VM types nope" in result.output


def test_the_slurm_drop_in_runs_the_daemon_as_slurm_user():
    settings = unit_settings((DEPLOY / "spotbag-slurm.conf").read_text())
    assert settings["User"] == ["slurm"] and settings["Group"] == ["slurm"]


@needs_systemd_analyze
def test_systemd_accepts_the_unit_with_the_slurm_drop_in(tmp_path):
    unit = unit_copy(tmp_path)
    drop_ins = tmp_path / f"{unit.name}.d"
    drop_ins.mkdir()
    (drop_ins / "slurm.conf").write_text((DEPLOY / "spotbag-slurm.conf").read_text())
    code, problems = verify_problems(unit)
    assert code == 0 and not problems, problems


@pytest.mark.slurm
def test_config_check_says_whether_slurm_is_ready(slurm_cluster, tmp_path):
    ready = tmp_path / "ready.toml"
    ready.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[executor]\nname = "slurm"\n[slurm]\n'
        f'slurm_conf = "{slurm_cluster.conf}"\nmunge_key = "file:{slurm_cluster.munge_key}"\n'
        '[[slurm.pools]]\npartition = "spot"\nnodes = "spot-[0-3]"\nvm_types = ["local-2"]\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "controller.cli", "config", "check", str(ready)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok  slurmctld answers" in result.stdout
    assert f"ok  where VMs fetch slurm.conf: {slurm_cluster.conf_server}" in result.stdout
    assert "ok  partition spotbag" in result.stdout and "ok  partition spot" in result.stdout
    assert "ok  jobcomp hook" in result.stdout

    broken = tmp_path / "broken.toml"
    broken.write_text(
        ready.read_text().replace(str(slurm_cluster.conf), str(tmp_path / "missing.conf"))
    )
    result = subprocess.run(
        [sys.executable, "-m", "controller.cli", "config", "check", str(broken)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode != 0
    assert "NO  slurmctld answers" in result.stdout
    assert "Slurm is not ready for spotbag" in result.stderr


@pytest.mark.slurm
def test_install_hooks_writes_working_hooks_and_a_private_secret(slurm_cluster, tmp_path):
    config = tmp_path / "spotbag.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[api]\nport = 9\n[executor]\nname = "slurm"\n'
        f'[slurm]\nslurm_conf = "{slurm_cluster.conf}"\nmunge_key = "file:/k"\n'
        '[[slurm.pools]]\npartition = "spot"\nnodes = "spot-[0-3]"\nvm_types = ["local-2"]\n'
    )
    dest, hook_config = tmp_path / "hooks", tmp_path / "etc" / "slurm-hooks.json"
    result = CliRunner().invoke(
        cli,
        [
            "slurm", "install-hooks", "--config", str(config), "--dest", str(dest),
            "--hook-config", str(hook_config), "--spool", str(tmp_path / "spool"),
            "--owner", "root", "--python", sys.executable,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    settings = json.loads(hook_config.read_text())
    assert settings["url"] == "http://127.0.0.1:9" and settings["pool_partitions"] == ["spot"]
    secret = Path(settings["secret_file"])
    daemon_secret = tmp_path / "state" / "slurm-hook.secret"
    assert secret.read_bytes().strip() == daemon_secret.read_bytes().strip()  # the daemon's
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    # The jobcomp hook runs (nobody listens on port 9: the event is spooled, exit 0).
    run = subprocess.run(
        [str(dest / "jobcomp")],
        env={"PARTITION": "spotbag", "JOBID": "1", "JOBNAME": "x", "JOBSTATE": "COMPLETED"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and len(os.listdir(tmp_path / "spool")) == 2  # event + lock
