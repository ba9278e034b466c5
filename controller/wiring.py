"""Building drivers, executors and the model book from configuration (the one place
that knows every driver's and executor's arguments)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from controller.config import Config, ConfigError
from controller.executors.base import Executor
from controller.executors.job_users import ACCOUNT, JobUserError, JobUsers
from controller.preemption.model_book import ModelBook
from drivers import driver_class
from drivers.base import Driver, SpotMarket, VmType

if TYPE_CHECKING:  # imported where used: each pulls in a cloud SDK or Slurm's tools
    from google.auth.credentials import Credentials

    from controller.slurm.commands import SlurmTools
    from drivers.aws import AwsSettings
    from drivers.gce import GceSettings
    from drivers.local_hosts import NamespaceHosts
    from policies.preemption import LifetimeModel

LIFETIMES_DRAWN = 256  # uniform draws made at once for VM lifetimes (LifetimeDraws)


class LifetimeDraws:
    """VM lifetimes for the local and sim drivers: each takes the next uniform draw of
    `rng` through its model's inverse transform, as `model.sample_h(rng, 1)` would (the
    same lifetimes for a seed), but a block of LIFETIMES_DRAWN draws is transformed at
    once per model: numpy costs ~40 µs a call whatever its size (7,600 VMs: 2 % of the
    100,000-job simulation)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._uniforms: np.ndarray = np.empty(0)
        self._next = 0  # the next unused draw of the block
        self._lifetimes_h: dict[LifetimeModel, list[float]] = {}  # of the block, per model
        self._without_draws: dict[LifetimeModel, float] = {}  # models that draw nothing

    def lifetime_h(self, model: LifetimeModel) -> float:
        if not model.draws:
            known = self._without_draws.get(model)
            if known is None:
                known = self._without_draws[model] = float(model.lifetimes_h(np.zeros(1))[0])
            return known
        if self._next == len(self._uniforms):
            self._uniforms = self._rng.random(LIFETIMES_DRAWN)
            self._next = 0
            self._lifetimes_h.clear()
        block = self._lifetimes_h.get(model)
        if block is None:
            block = self._lifetimes_h[model] = model.lifetimes_h(self._uniforms).tolist()
        self._next += 1
        return block[self._next - 1]


def make_model_book(
    config: Config, *, driver_name: str, boot_delay_s: float, time_scale: float
) -> ModelBook:
    """The models for this driver; a fresh VM costs the boot delay, in model hours."""
    model_keys = {t.name: t.model_key for t in config.vm_types}
    return ModelBook(
        config.preemption, driver_name, model_keys, launch_h=boot_delay_s * time_scale / 3600.0
    )


def make_driver(
    config: Config,
    *,
    name: str,
    now: Callable[[], float],
    call_at: Callable[[float, Callable[[], None]], Any],
    rng: np.random.Generator,
    boot_delay_s: float,
    time_scale: float,
    book: ModelBook,
    controller_id: str = "",
    state_dir: Path | None = None,
    notice_lead_s: float = 0.0,
    spot_market: SpotMarket | None = None,
) -> Driver:
    """The driver `name`; cloud drivers mark their VMs with `controller_id` (the store's
    own id, so that after a restart the daemon finds the VMs it owns). The local driver's
    VM hosts keep their consoles under `state_dir`."""
    cls = driver_class(name)
    if name == "aws":
        return cls(config.catalog(), aws_settings(config, controller_id), now=now)
    if name == "gce":
        return cls(
            config.catalog(),
            gce_settings(config, controller_id),
            now=now,
            credentials=_anonymous() if config.gce.anonymous_credentials else None,
        )
    if name in ("local", "sim"):
        draws = LifetimeDraws(rng)

        def lifetime_h(vm_type: VmType) -> float:
            """One lifetime (model hours) from the configured model for this type and moment."""
            when = dt.datetime.fromtimestamp(now(), dt.UTC)
            return draws.lifetime_h(book.configured(vm_type, when).model)

        hosts = None
        if name == "local" and config.driver.hosts == "netns":
            hosts = local_hosts(config, controller_id, state_dir or config.resolved_state_dir())
        return cls(
            config.catalog(),
            now=now,
            call_at=call_at,
            lifetime_h=lifetime_h,
            boot_delay_s=boot_delay_s,
            time_scale=time_scale,
            notice_lead_s=notice_lead_s,
            api_notices=config.driver.api_notices,
            spot_market=spot_market,
            **(
                {
                    "hosts": hosts,
                    "controller_id": controller_id,
                    "metadata": config.driver.metadata_server,
                }
                if hosts is not None
                else {}
            ),
        )
    raise ValueError(f"driver {name!r} cannot be built from this configuration")


def local_hosts(config: Config, controller_id: str, state_dir: Path) -> NamespaceHosts:
    """VM hosts in network namespaces for the local driver (drivers/local_hosts.py)."""
    from drivers.local_hosts import PRIVATE_DIRS, HostError, NamespaceHosts

    private: tuple[str, ...] = PRIVATE_DIRS
    if config.slurm.munge_socket:  # each VM host runs its own munged there
        private = (*private, os.path.dirname(config.slurm.munge_socket))
    try:
        return NamespaceHosts(
            bridge=config.driver.host_bridge,
            subnet=config.driver.host_subnet,
            consoles=state_dir / "vms",
            prefix=f"sb{controller_id[:8]}-",
            private_dirs=private,
        )
    except (HostError, ValueError) as exc:
        raise ConfigError(f"[driver] hosts = netns: {exc}") from None


def make_job_users(config: Config, state_dir: Path, *, as_daemon: bool = True) -> JobUsers:
    """Who jobs run as (`[executor] run_as`, `run_as_accounts`), checked: every user
    named outright exists and is neither root nor the daemon's user; the daemon can
    switch to them (it runs as root); they can pass through the directories above
    where their files are (the state directory; for Slurm, the shared directory).
    `as_daemon=False` (`spotbag config check`): the checks that need not be made as
    the daemon's user."""
    executor = config.executor
    users = JobUsers(executor.run_as, executor.run_as_accounts)
    if not users.configured:
        return users
    try:
        for account, name in sorted(executor.run_as_accounts.items()):
            users.lookup(name, f"executor.run_as_accounts: the jobs of account {account!r}")
        if ACCOUNT not in executor.run_as and executor.run_as:
            users.lookup(executor.run_as, "executor.run_as: jobs")
    except JobUserError as exc:
        raise ConfigError(str(exc)) from None
    if as_daemon and os.geteuid() != 0:
        raise ConfigError(
            "executor.run_as / run_as_accounts need the daemon to run as root, to start "
            f"jobs as those users (it runs as uid {os.geteuid()}); leave them empty to run "
            "jobs as the daemon's user"
        )
    if config.executor.name == "slurm":
        where = Path(config.slurm.shared_dir) if config.slurm.shared_dir else state_dir / "shared"
    else:
        where = state_dir
    for above in where.resolve().parents:
        if above.exists() and not above.stat().st_mode & 0o001:
            raise ConfigError(
                f"executor.run_as: the jobs' users cannot pass through {above} to their "
                f"files and checkpoint directories under {where}; let others pass (chmod "
                f"o+x {above}) or put {where} elsewhere"
            )
    return users


async def make_executor(
    config: Config,
    *,
    state_dir: Path,
    controller_id: str,
    now: Callable[[], float],
    call_at: Callable[[float, Callable[[], None]], Any],
    head_address: str = "",
) -> Executor:
    """The executor [executor] names. For Slurm, a conf_server left empty is found with
    `scontrol show config` (or is the local VM hosts' view of this host)."""
    if config.executor.name == "sim":
        from controller.executors.sim import SimExecutor

        # Its own generator: the driver's draws (lifetimes) stay as they were.
        rng = np.random.default_rng(config.driver.seed).spawn(2)[1]
        return SimExecutor(now=now, call_at=call_at, rng=rng)
    if config.executor.name == "local":
        from controller.executors.local import LocalExecutor

        return LocalExecutor(
            state_dir,
            controller_id=controller_id,
            now=now,
            kill_grace_s=config.executor.kill_grace_s,
            users=make_job_users(config, state_dir),
            queue_ahead=config.executor.queue_ahead,
        )
    from controller.slurm.executor import SlurmExecutor, SlurmExecutorSettings

    slurm = config.slurm
    if not slurm.munge_key:
        raise ConfigError(
            "executor slurm needs [slurm] munge_key: where VMs fetch the munge key "
            "(aws-secretsmanager:NAME, aws-ssm:NAME, gcp-secretmanager:..., file:PATH)"
        )
    tools = slurm_tools(config)
    conf_server = slurm.conf_server or await discover_conf_server(tools, head_address)
    settings = SlurmExecutorSettings(
        partition=slurm.partition,
        node_prefix=slurm.node_prefix,
        node_feature=slurm.node_feature,
        conf_server=conf_server,
        munge_key=slurm.munge_key,
        munge_socket=slurm.munge_socket,
        shared_dir=Path(slurm.shared_dir) if slurm.shared_dir else state_dir / "shared",
        shared_mount=slurm.shared_mount,
        poll_interval_s=slurm.poll_interval_s,
        file_poll_s=slurm.file_poll_s,
        pending_timeout_s=slurm.pending_timeout_s,
        queue_ahead=slurm.queue_ahead,
    )
    return SlurmExecutor(
        settings,
        tools=tools,
        controller_id=controller_id,
        now=now,
        kill_grace_s=config.executor.kill_grace_s,
        users=make_job_users(config, state_dir),
    )


def slurm_tools(config: Config) -> SlurmTools:
    from controller.slurm.commands import SlurmTools

    slurm = config.slurm
    return SlurmTools(
        slurm_conf=slurm.slurm_conf or os.environ.get("SLURM_CONF", ""),
        bin_dir=slurm.bin_dir,
        timeout_s=slurm.command_timeout_s,
    )


async def discover_conf_server(tools: SlurmTools, head_address: str = "") -> str:
    """host:port of slurmctld from `scontrol show config` (SlurmctldHost's address, else
    its name; `head_address` instead when the VMs reach this host there)."""
    from controller.slurm.commands import SlurmError

    try:
        out = await tools.run("scontrol", "show", "config")
    except SlurmError as exc:
        raise ConfigError(
            f"[slurm] conf_server is empty and Slurm cannot say where slurmctld is: {exc}"
        ) from None
    host = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
    port = re.search(r"^SlurmctldPort\s*=\s*(\d+)", out, re.M)
    if host is None:
        raise ConfigError("[slurm] conf_server is empty and scontrol shows no SlurmctldHost")
    address = head_address or host.group(2) or host.group(1)
    return f"{address}:{port.group(1)}" if port else address


def aws_settings(config: Config, controller_id: str) -> AwsSettings:
    from drivers.aws import AwsSettings

    aws = config.aws
    if not aws.region:
        raise ConfigError("driver aws needs [aws] region")
    try:
        return AwsSettings(
            region=aws.region,
            controller_id=controller_id,
            endpoint_url=aws.endpoint_url or None,
            image_id=aws.image_id,
            subnet_ids=aws.subnet_ids,
            security_group_ids=aws.security_group_ids,
            iam_instance_profile=aws.iam_instance_profile or None,
            key_name=aws.key_name or None,
            max_spot_price=aws.max_spot_price or None,
            user_data_template=aws.user_data_template or None,
            controller_url=aws.controller_url,
            on_demand_prices=aws.on_demand_prices,
            max_concurrency=aws.max_concurrency,
            max_retries=aws.max_retries,
            price_cache_s=aws.price_cache_s,
            notices=aws.notices,
        )
    except ValueError as exc:
        raise ConfigError(f"[aws]: {exc}") from None


def gce_settings(config: Config, controller_id: str) -> GceSettings:
    from drivers.gce import GceSettings

    gce = config.gce
    if not gce.project or not gce.zones:
        raise ConfigError("driver gce needs [gce] project and zones (at least one zone)")
    try:
        return GceSettings(
            project=gce.project,
            zones=gce.zones,
            controller_id=controller_id,
            api_endpoint=gce.api_endpoint or None,
            source_image=gce.source_image,
            network=gce.network,
            subnetwork=gce.subnetwork or None,
            service_account_email=gce.service_account_email or None,
            provisioning=gce.provisioning,
            termination_action=gce.termination_action,
            max_concurrency=gce.max_concurrency,
            max_retries=gce.max_retries,
            operation_timeout_s=gce.operation_timeout_s,
            spot_prices={t.name: t.spot_price_per_hour for t in config.vm_types},
            startup_script=gce.startup_script or None,
            notices=gce.notices,
        )
    except ValueError as exc:
        raise ConfigError(f"[gce]: {exc}") from None


def _anonymous() -> Credentials:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()
