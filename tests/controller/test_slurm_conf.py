"""What `spotbag slurm conf` emits for a config (controller/slurm/conf.py, setup.py).

The tests' Slurm cluster runs this very fragment (tests/slurm_cluster.py), so these
check the settings and their source; the cluster's tests check that Slurm behaves so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config
from controller.slurm.setup import fragment_for, hook_install_for

POOLS = """
[executor]
name = "slurm"

[slurm]
{slurm}

[[slurm.pools]]
partition = "spot"
nodes = "spot-[0-3]"
vm_types = ["local-2"]
{spot}

[[slurm.pools]]
partition = "big"
nodes = "big-[00-15]"
vm_types = ["local-8"]
"""


def config_of(tmp_path: Path, slurm: str = "", spot: str = ""):
    path = tmp_path / "spotbag.toml"
    path.write_text(POOLS.format(slurm=slurm, spot=spot))
    return load_config(path)


def setting(fragment: str, key: str) -> list[str]:
    """The values of `key=` lines (not comments) of the fragment."""
    return re.findall(rf"^{key}=(.*)$", fragment, re.MULTILINE)


def partition_line(fragment: str, name: str) -> str:
    (line,) = [x for x in fragment.splitlines() if x.startswith(f"PartitionName={name} ")]
    return line


def test_the_defaults_give_requeued_jobs_a_short_hold_and_say_how_to_merge(tmp_path):
    fragment = fragment_for(config_of(tmp_path), "/hooks")
    # Slurm's default (120 s) would hold a preempted user's job over 2 minutes.
    assert setting(fragment, "AuthInfo") == ["cred_expire=20"]
    assert "# AuthInfo=socket=/run/munge/munge.socket.2,cred_expire=20" in fragment
    assert setting(fragment, "SchedulerParameters") == [
        "batch_sched_delay=0,sched_interval=1,default_queue_depth=1000,sched_min_interval=100000"
    ]
    assert setting(fragment, "MinJobAge") == ["600"]
    assert setting(fragment, "SelectType") == ["select/cons_tres"]
    assert setting(fragment, "SelectTypeParameters") == ["CR_CPU"]
    assert setting(fragment, "ReturnToService") == ["2"]
    # Each pool keeps its idle VMs for its own SuspendTime (default 5 minutes).
    assert " SuspendTime=300 " in partition_line(fragment, "spot")
    assert " SuspendTime=300 " in partition_line(fragment, "big")
    assert partition_line(fragment, "big").endswith(" ResumeTimeout=600")
    assert setting(fragment, "MaxNodeCount") == [str(1000 + 4 + 16)]
    # Every key is set once: a second line would silently win over the first.
    keys = [line.split("=", 1)[0] for line in fragment.splitlines() if line[:1].isalpha()]
    singles = [k for k in keys if k not in ("NodeName", "PartitionName", "NodeSet")]
    assert len(singles) == len(set(singles)), singles


def test_the_settings_come_from_the_config(tmp_path):
    config = config_of(
        tmp_path,
        slurm='cred_expire_s = 45\nmunge_socket = "/run/m/munge.sock"',
        spot="suspend_time_s = 90\nresume_timeout_s = 240",
    )
    fragment = fragment_for(config, "/hooks")
    # The socket the config names is merged already: the line can be used as it is.
    assert setting(fragment, "AuthInfo") == ["socket=/run/m/munge.sock,cred_expire=45"]
    spot, big = partition_line(fragment, "spot"), partition_line(fragment, "big")
    assert " SuspendTime=90 " in spot and spot.endswith(" ResumeTimeout=240")
    assert " SuspendTime=300 " in big and big.endswith(" ResumeTimeout=600")
    # The slurmctld prolog waits for a power-up as long as Slurm does.
    install = hook_install_for(
        config,
        dest=tmp_path / "h",
        config_path=tmp_path / "h.json",
        url="http://x",
        secret=b"s",
        spool_dir=tmp_path / "spool",
        python="/usr/bin/python3",
    )
    assert install.power_up_wait_s == 600
    assert install.pool_partitions == ["spot", "big"]


@pytest.mark.parametrize(
    ("slurm", "spot", "words"),
    [
        ("cred_expire_s = 4", "", "cred_expire_s: Input should be greater than or equal to 5"),
        ("", "suspend_time_s = 0", "suspend_time_s: Input should be greater than or equal to 1"),
    ],
)
def test_settings_slurm_would_not_take_are_refused(tmp_path, slurm, spot, words):
    with pytest.raises(ConfigError, match=words):
        config_of(tmp_path, slurm=slurm, spot=spot)
