"""Daemon configuration: TOML on disk, every setting with a default and a description.

The models below are the single source of the documentation: `spotbag config
defaults` renders them as a commented TOML file (deploy/spotbag.toml is that
output, and a test keeps it so). Unknown keys are errors, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from controller.bags.spec import ACCOUNT_NAME
from controller.errors import SpotbagError
from controller.executors.job_users import ACCOUNT, template_problem
from controller.notify.kinds import EventKind
from drivers.base import VmType


class ConfigError(SpotbagError, ValueError):
    """A configuration file or value that cannot be used; the message says where and why."""

    code = "config_error"
    exit_code = 78


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# The largest request body, by default: also what `spotbag submit` lets a YAML file's
# aliases expand to (controller/cli/specfile.py).
DEFAULT_MAX_BODY_MB = 64.0


class ApiConfig(_Section):
    host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(
        8787,
        ge=0,
        le=65535,
        description="TCP port of the HTTP API; 0 picks a free port. The URL actually "
        "served is written to STATE_DIR/api.url.",
    )
    token: str = Field(
        "",
        description="Bearer token every /v1 request must carry. Empty: use the "
        "SPOTBAG_TOKEN environment variable, else generate a random token into "
        "STATE_DIR/token (mode 0600).",
    )
    max_body_mb: float = Field(
        DEFAULT_MAX_BODY_MB, gt=0, description="Largest request body accepted, in MB."
    )
    max_jobs_per_bag: int = Field(
        1_000_000, ge=1, description="Largest number of jobs (parameter points) in one bag."
    )
    # Resource limits (issue 23): slow or idle clients must not hold the daemon's
    # descriptors, which its jobs, database and drivers need too.
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A client must send a request's line and headers within this many "
        "seconds of connecting, or of the previous answer on a kept-alive connection; "
        "the connection is closed otherwise (this is also how long an idle kept-alive "
        "connection stays open).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A request's body must have arrived this many seconds after its "
        "headers; otherwise the answer is 408 and the connection is closed. Raise it with "
        "max_body_mb for clients on slow links.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Most HTTP connections open at once. At the cap a new connection "
        "closes the oldest one that is not in a request (idle, or still sending its "
        "headers), else it is refused (503). Lowered at start to what the descriptor "
        "limit (RLIMIT_NOFILE, LimitNOFILE= in the unit) leaves after reserved_fds.",
    )
    max_connections_per_client: int = Field(
        64,
        ge=1,
        description="Most HTTP connections open at once from one client address; more "
        "are refused at once with 503. Behind a reverse proxy every client has the "
        "proxy's address: raise it to max_connections there.",
    )
    reserved_fds: int = Field(
        512,
        ge=0,
        description="File descriptors kept out of HTTP clients' reach: for the daemon's "
        "own work (the database, job logs and processes, Slurm commands, cloud API "
        "sessions) and for connections being accepted or closed, which under a flood "
        "are a few hundred at once (accept() takes up to 128 at a time).",
    )


class SchedulerConfig(_Section):
    max_vms: int = Field(4, ge=1, description="Most VMs alive (pending or running) at once.")
    idle_timeout_s: float = Field(
        60.0, ge=0, description="A VM with no job for this long is terminated."
    )
    poll_interval_s: float = Field(
        1.0,
        gt=0,
        description="Longest wait between two scheduling passes; submissions, job ends "
        "and VM changes wake the scheduler earlier.",
    )
    boot_timeout_s: float = Field(
        900.0, gt=0, description="A VM still pending this long after its launch is terminated."
    )
    describe_interval_s: float = Field(
        30.0, gt=0, description="How often VMs are re-described for drivers that push no events."
    )
    launch_backoff_s: float = Field(
        10.0,
        ge=0,
        description="After a failed launch, wait this long before that VM type is tried again.",
    )
    launch_backoff_max_s: float = Field(
        300.0, ge=0, description="The launch back-off doubles per failure up to this."
    )
    max_concurrent_calls: int = Field(
        16, ge=1, description="Most driver/executor calls in flight at once."
    )


# The names drivers/__init__.py registers (a test keeps the two lists equal).
DriverName = Literal["local", "sim", "aws", "gce"]


class DriverConfig(_Section):
    name: DriverName = Field(
        "local",
        description="Which cloud runs the VMs: local (this host), sim (simulated, virtual time), "
        "aws (EC2 spot) or gce (Compute Engine Spot VMs).",
    )
    boot_delay_s: float = Field(
        0.5, ge=0, description="Local driver: seconds from launch until a VM can run jobs."
    )
    notice_lead_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Local and sim drivers: a preemption notice comes this many model seconds "
        "before each sampled preemption, as the cloud the VMs stand for gives one (EC2 120, "
        "GCE 30); 0: none. The VM takes no new job from the notice on and its checkpointable "
        "jobs are signalled (docs/design.md#checkpoint-notices).",
    )
    time_scale: float = Field(
        1.0,
        gt=0,
        description="Local driver: how much faster than real time VM lifetimes pass; "
        "1440 turns a 24 h preemption model into one real minute.",
    )
    seed: int | None = Field(
        None, description="Seed for sampled VM lifetimes; unset: a different run every time."
    )
    hosts: Literal["none", "netns"] = Field(
        "none",
        description="Local driver: none (VMs are bookkeeping, jobs run on this host) or netns "
        "(each VM is a network namespace on host_bridge that runs the VM boot script, so "
        "with executor slurm its slurmd joins and the jobs run there; needs root).",
    )
    host_bridge: str = Field(
        "spotbag0",
        description="Local driver, hosts = netns: the bridge the VM hosts join. One daemon "
        "per bridge: each hands the subnet's addresses to its own VM hosts only.",
    )
    host_subnet: str = Field(
        "10.203.0.0/24",
        description="Local driver, hosts = netns: the bridge's subnet; its first address is "
        "this host's (the Slurm controller the VMs reach).",
    )
    metadata_server: Literal["none", "aws", "gce"] = Field(
        "gce",
        description="Local driver, hosts = netns: which cloud's metadata server the VM hosts "
        "see (served on the bridge): gce (instance/preempted) or aws (IMDSv2: "
        "spot/instance-action, rebalance recommendations). Each VM's boot script starts a "
        "watcher of it that drains the VM's Slurm node on a notice, which the controller reads "
        "(docs/checkpoints.md#notices); none: no server and no watcher.",
    )
    api_notices: bool = Field(
        True,
        description="Local and sim drivers: preemption notices are told through the driver's "
        "API, as GCE's and EC2's are; false: only the VMs' metadata servers tell them.",
    )


# Choices are Literal types, so pydantic rejects anything else with the allowed values
# listed, and mypy checks the code that compares against them.
PreemptionModelName = Literal["none", "exponential", "bathtub", "fitted"]


class PreemptionConfig(_Section):
    model: PreemptionModelName = Field(
        "none",
        description="How VMs of the local and sim drivers die, and what the scheduler assumes until "
        "it has learned better: none; exponential (mttf_h, max_lifetime_h); bathtub (the bathtub_* "
        "parameters); fitted (the shipped models fitted to real Google preemptions, looked up by "
        "each VM type's model_key).",
    )
    mttf_h: float = Field(
        24.0, gt=0, description="exponential: mean time to preemption, model hours."
    )
    max_lifetime_h: float | None = Field(
        None,
        gt=0,
        description="exponential: hard deadline on a VM's life in model hours (Google: 24); unset: none.",
    )
    bathtub_A: float = Field(
        0.35, gt=0, le=1, description="bathtub: weight A of the two preemption processes."
    )
    bathtub_tau1: float = Field(
        2.3, gt=0, description="bathtub: time scale of early preemptions, hours."
    )
    bathtub_tau2: float = Field(
        0.8, gt=0, description="bathtub: time scale of the rise before the deadline, hours."
    )
    bathtub_b: float = Field(24.0, gt=0, description="bathtub: when the late rise sets in, hours.")
    deadline_h: float = Field(
        24.0, gt=0, description="bathtub and fitted: the provider's maximum VM life L, hours."
    )
    registry_file: str = Field(
        "",
        description="fitted: a model registry JSON (spotbag fit --registry) used instead of the shipped one.",
    )
    min_samples: int = Field(
        30,
        ge=5,
        description="A model is used for a key only when fitted on at least this many VM lifetimes.",
    )
    reuse_policy: Literal["model", "always"] = Field(
        "model",
        description="model: start a job on an idle VM only when, by the VM's preemption model and age, "
        "that beats a fresh VM (docs/design.md#reuse); always: reuse any idle VM (memoryless thinking).",
    )
    hot_spare_h: float = Field(
        1.0,
        ge=0,
        description="Idle VMs past their risky start are kept this long (model hours) as hot spares.",
    )
    learn: bool = Field(
        True, description="Refit models from the lifetimes this controller observes."
    )
    refit_interval_s: float = Field(
        600.0, gt=0, description="How often (real seconds) to consider refitting."
    )
    drift_window: int = Field(
        50,
        ge=10,
        description="Recent lifetimes per key tested against the model in use; a misfit triggers a refit.",
    )


CheckpointPolicyName = Literal["optimal", "young-daly", "none"]


class CheckpointConfig(_Section):
    policy: CheckpointPolicyName = Field(
        "optimal",
        description="When checkpointable jobs are signalled: optimal (the dynamic program over "
        "the VM's preemption model, from its age and the job's remaining work, docs/design.md#checkpoints); "
        "young-daly (every sqrt(2·δ·MTTF), MTTF from the model); none (never).",
    )
    step_s: float = Field(
        60.0,
        gt=0,
        description="Grid of the optimal schedule, model seconds: checkpoints fall on multiples of it.",
    )
    max_work_h: float = Field(
        24.0,
        gt=0,
        description="Longest remaining work the schedule tables cover, model hours (longer jobs "
        "are planned as if this much were left).",
    )
    confirm_timeout_s: float = Field(
        120.0,
        gt=0,
        description="A job that has not written its checkpoint this long (real seconds, at least "
        "5 × its checkpoint_cost_s) after the signal is taken not to have checkpointed.",
    )
    min_interval_s: float = Field(
        1.0,
        ge=0,
        description="Never signal a job again sooner than this (real seconds) after its last checkpoint.",
    )


class LedgerConfig(_Section):
    gpu_weight: float = Field(
        20.0,
        ge=0,
        description="CPU-hours one GPU-hour counts as (a job's rate is cpus + gpu_weight × gpus).",
    )
    charge_preempted: bool = Field(
        True, description="Charge attempts cut short by a preemption for the time they ran."
    )
    new_accounts: Literal["unlimited", "credit", "refuse"] = Field(
        "unlimited",
        description="A bag for an account that does not exist: unlimited (create it with no "
        "limit: usage is recorded, nothing is refused), credit (create it with "
        "new_account_cpu_h), or refuse (accounts are created by an admin: spotbag accounts create).",
    )
    new_account_cpu_h: float = Field(
        0.0, ge=0, description="new_accounts = credit: the allocation a new account starts with."
    )


class GceConfig(_Section):
    """driver.name = "gce": Google Compute Engine Spot VMs. Credentials come from the
    SDK's standard chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default
    login, or the head node's service account), never from this file."""

    project: str = Field("", description="GCP project id the VMs are created in.")
    zones: tuple[str, ...] = Field(
        (), description='Zones to launch in (a VM type\'s own zone wins), e.g. ["us-central1-a"].'
    )
    api_endpoint: str = Field(
        "", description="Compute API endpoint; empty: Google's. Tests point it at a local fake."
    )
    anonymous_credentials: bool = Field(
        False, description="Send no credentials (only for a local fake or emulator)."
    )
    source_image: str = Field(
        "projects/debian-cloud/global/images/family/debian-12", description="Boot disk image."
    )
    network: str = Field("global/networks/default", description="VPC network.")
    subnetwork: str = Field(
        "", description="regions/R/subnetworks/S; empty: the network's default."
    )
    service_account_email: str = Field(
        "", description="Service account the VMs run as; empty: none."
    )
    provisioning: Literal["spot", "preemptible"] = Field(
        "spot", description="spot (provisioningModel SPOT) or preemptible (the legacy model)."
    )
    termination_action: Literal["DELETE", "STOP"] = Field(
        "DELETE",
        description="What GCE does to a preempted Spot VM: DELETE or STOP (disks kept, billed).",
    )
    max_concurrency: int = Field(8, ge=1, description="Compute API calls in flight at once.")
    max_retries: int = Field(5, ge=0, description="Retries of a throttled or failed call.")
    operation_timeout_s: float = Field(120.0, gt=0, description="Longest wait for an operation.")
    startup_script: str = Field("", description="Startup script of the VMs (metadata).")
    notices: bool = Field(
        True,
        description="Hear preemption notices from the API: each describe also lists the "
        "zones' running compute.instances.preempted operations (docs/clouds.md#notices).",
    )


class AwsConfig(_Section):
    """driver.name = "aws": EC2 Spot instances. Credentials come from boto3's standard
    chain (AWS_* environment variables, ~/.aws files, SSO, or the head node's instance
    profile), never from this file."""

    region: str = Field(
        "", description="Default region; a VM type's availability zone implies its own."
    )
    endpoint_url: str = Field(
        "", description="EC2 endpoint; empty: AWS's. Tests point it at a moto server."
    )
    image_id: str = Field(
        "resolve:ssm:/aws/service/debian/release/12/latest/amd64",
        description="AMI id, or an SSM parameter (resolve:ssm:...) that names one.",
    )
    subnet_ids: dict[str, str] = Field(
        {}, description='Subnet per availability zone, e.g. {"us-east-1a" = "subnet-0abc"}.'
    )
    security_group_ids: tuple[str, ...] = Field((), description="Security groups of the VMs.")
    iam_instance_profile: str = Field(
        "", description="Instance profile (name or ARN) the VMs run with; empty: none."
    )
    key_name: str = Field("", description="EC2 key pair for SSH; empty: none.")
    max_spot_price: float = Field(
        0.0,
        ge=0,
        description="Highest spot price, USD/hour; 0: the on-demand price (EC2's default).",
    )
    user_data_template: str = Field(
        "",
        description="User data template file ($token, $controller_id, $controller_url, "
        "$vm_type); empty: the bundled bootstrap.",
    )
    controller_url: str = Field("", description="URL the VMs call the controller back on.")
    on_demand_prices: dict[str, float] = Field(
        {}, description="On-demand USD/hour per type, over the bundled price table."
    )
    max_concurrency: int = Field(8, ge=1, description="EC2 API calls in flight at once.")
    max_retries: int = Field(5, ge=0, description="Retries of a throttled or failed call.")
    price_cache_s: float = Field(300.0, ge=0, description="How long spot prices read are reused.")
    notices: bool = Field(
        True,
        description="Hear interruption notices from the API: each describe also asks which "
        "spot requests are marked for termination (docs/clouds.md#notices).",
    )


class HoppingConfig(_Section):
    """Spot hopping by cloud-index tracking (docs/design.md#index-tracking): sample spot prices, choose the
    type of new VMs by a policy, and move checkpointable jobs when the move pays."""

    enabled: bool = Field(True, description="Sample prices and choose types by the policy.")
    policy: Literal["static", "cost", "availability", "balanced"] = Field(
        "balanced",
        description="static (cheapest window mean), cost (cheapest now), availability "
        "(steadiest below the index) or balanced (best modified Sharpe ratio).",
    )
    migrate: bool = Field(
        True, description="Move checkpointable running jobs to another type when it pays."
    )
    interval_s: float = Field(
        300.0, gt=0, description="Model seconds between two price samples and decisions."
    )
    window_s: float = Field(
        86400.0, gt=0, description="Model seconds of prices the statistics look back over."
    )
    retention_days: float = Field(30.0, gt=0, description="How long price samples are kept.")
    migration_s_per_gb: float = Field(
        1.0, ge=0, description="Stop-and-copy time per GB a job uses (plus the boot delay)."
    )
    bid_factor: float = Field(
        1.0, gt=0, description="A type priced above this × its on-demand price is not used."
    )
    literal_trigger: bool = Field(
        False,
        description="Migrate by the paper's printed eq. 5 instead of the corrected rule "
        "(docs/design.md#migration-rule).",
    )
    trace: str = Field(
        "",
        description="local/sim drivers: a spot price trace (CSV, like the shipped spot-prices dataset) "
        "replayed as the live prices; empty: the catalog's prices.",
    )
    trace_speed: float = Field(1.0, gt=0, description="Trace seconds replayed per model second.")
    trace_types: dict[str, str] = Field(
        {}, description='Catalog type -> trace type, e.g. {"local-2" = "r3.large"}.'
    )


class CostConfig(_Section):
    """How cost reports split a shared VM's cost among its jobs (docs/design.md#cost-reports)."""

    cpu_weight: float = Field(0.9, ge=0, description="Relative cost weight of one vCPU.")
    memory_weight: float = Field(0.1, ge=0, description="Relative cost weight of one GB of memory.")
    gpu_weight: float = Field(9.0, ge=0, description="Relative cost weight of one GPU.")


class ExecutorConfig(_Section):
    name: Literal["local", "slurm", "sim"] = Field(
        "local",
        description="Where jobs run: local (processes on this host), slurm (Slurm jobs on "
        "the VMs, which join the cluster as nodes; see [slurm]) or sim (no program runs: "
        "each attempt takes its bag's simulation runtime on the daemon's clock; with "
        'driver "sim", a daemon to try the API and web UI on).',
    )
    kill_grace_s: float = Field(
        5.0,
        ge=0,
        description="Seconds between SIGTERM and SIGKILL when a job is cancelled (and, for "
        "the local executor, when the daemon stops).",
    )
    queue_ahead: float = Field(
        1.0,
        ge=0,
        description="Local executor: attempts handed to it beyond what a VM runs at once, as "
        "a fraction of the VM's capacity (1: one more VM-full waits in the daemon), so that "
        "the next starts the moment a job ends, without waiting for a scheduler pass; they "
        "count as starting, not running, and a cancel ends them at once. 0: only what fits. "
        "For jobs too short for it to last until the next pass, the queue holds two pass "
        "intervals' worth (at most 16 VM-fulls; docs/architecture.md#local-queue).",
    )
    run_as: str = Field(
        "",
        description="Daemon running as root: the unprivileged user jobs run as (its primary "
        "group, no others), so they cannot read the daemon's token or database. "
        '"spotbag-{account}" gives each account a user of its own, so that one account\'s '
        "jobs cannot read or forge another's results or checkpoints "
        "(docs/operations.md#job-isolation); one name for all: accounts share that user. Empty: jobs run as the "
        "daemon's user (and can read all of it).",
    )
    run_as_accounts: dict[str, str] = Field(
        {},
        description='Account -> the user its jobs run as, e.g. {lab = "alice"}; before '
        "run_as, which then serves the accounts not named here (empty run_as: only these "
        "accounts may submit bags).",
    )

    @field_validator("run_as")
    @classmethod
    def _run_as_template(cls, value: str) -> str:
        problem = template_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("run_as_accounts")
    @classmethod
    def _run_as_users(cls, value: dict[str, str]) -> dict[str, str]:
        for account, user in value.items():
            if not re.fullmatch(ACCOUNT_NAME, account):
                raise ValueError(f"{account!r} is not an account name")
            problem = template_problem(user) or (
                f"{ACCOUNT} has no place here" if ACCOUNT in user else None
            )
            if not user or problem is not None:
                raise ValueError(f"{account}: {problem or 'no user named'}")
        return value


class SlurmPoolConfig(_Section):
    """A power-saving pool: CLOUD nodes in slurm.conf that spotbag backs with spot VMs
    when Slurm resumes them, so Slurm users' own jobs run on spot VMs."""

    partition: str = Field(min_length=1, description="The pool's Slurm partition.")
    nodes: str = Field(
        min_length=1, description='Its node names, a Slurm hostlist, e.g. "spot-m5l-[0-19]".'
    )
    vm_types: tuple[str, ...] = Field(
        min_length=1,
        description="Catalog types a pool VM may be (one shape: the first one's CPUs and "
        "memory are the nodes'); the hopping policy picks among them.",
    )
    reserve_hours: float = Field(
        24.0,
        gt=0,
        description="A job with no time limit reserves its CPUs × this many hours while it "
        "runs (a job with a limit reserves its CPUs × its limit).",
    )
    job_hours: float = Field(
        1.0,
        gt=0,
        description="Typical length of a job on this pool, model hours: an idle pool VM on "
        "which the reuse policy would not start a job this long (it is too close to its "
        "preemption or deadline, docs/design.md#reuse) is powered down, so the next job gets a fresh VM.",
    )
    suspend_time_s: int = Field(
        300,
        ge=1,
        description="Slurm's SuspendTime for the pool (`spotbag slurm conf`): a pool VM left "
        "idle this long is terminated. Until then it waits, and is paid for, so that the next "
        "job starts at once instead of after a VM's boot and join (1-3 minutes): shorter is "
        "cheaper, longer makes a stream of jobs faster. Slurm looks about every 10 s, so a VM "
        "may stay up to 10 s longer.",
    )
    resume_timeout_s: int = Field(
        600,
        ge=30,
        description="Slurm's ResumeTimeout for the pool: a node whose VM has not joined this "
        "long after Slurm resumed it is given up (ResumeFailProgram) and its job requeued; the "
        "slurmctld prolog waits at most this long for a node's power-up. Above a spot VM's "
        "boot and join time (1-3 minutes), with room for a slow one.",
    )


class SlurmConfig(_Section):
    """executor.name = "slurm": every attempt is a Slurm job pinned to its VM's node; VMs
    join as dynamic nodes named after them (docs/slurm.md)."""

    slurm_conf: str = Field(
        "",
        description="The cluster's slurm.conf for the daemon's Slurm commands; empty: "
        "SLURM_CONF of the daemon's environment, else Slurm's default.",
    )
    bin_dir: str = Field("", description="Where sbatch, squeue, ... are; empty: on PATH.")
    partition: str = Field("spotbag", description="The partition of spotbag's own nodes.")
    node_prefix: str = Field(
        "sb-",
        description="Node names are <node_prefix><VM id>. Two controllers on one cluster "
        "need different prefixes and partitions.",
    )
    node_feature: str = Field(
        "spotbag",
        description="The feature spotbag's nodes register with (the partition's NodeSet).",
    )
    conf_server: str = Field(
        "",
        description="host[:port] the VMs' slurmd fetch slurm.conf from (configless); empty: "
        "SlurmctldHost's address and SlurmctldPort, as `scontrol show config` says.",
    )
    munge_key: str = Field(
        "",
        description="Where VMs fetch the munge key with their own role: "
        "aws-secretsmanager:NAME, aws-ssm:NAME, gcp-secretmanager:projects/P/secrets/S/versions/V, "
        "or file:PATH (baked into the image; the local driver's hosts share this host's disk).",
    )
    munge_socket: str = Field(
        "",
        description="The munge socket the cluster's slurm.conf names (AuthInfo=socket=); "
        "empty: munge's default.",
    )
    cred_expire_s: int = Field(
        20,
        ge=5,
        description="Slurm's job credential lifetime (AuthInfo=cred_expire, `spotbag slurm "
        "conf`), which is also how long Slurm holds a requeued job before it may run again: "
        "a Slurm user's pool job whose VM was preempted waits this long + 1 s (Slurm's "
        "default, 120 s, makes it over 2 minutes). Shorter: requeued jobs run sooner after a "
        "preemption; too short: a job step whose launch takes longer (a slow prolog, loading "
        "the user's environment, a paged-out slurmd) fails with an expired credential. Slurm "
        "takes no less than 5.",
    )
    shared_dir: str = Field(
        "",
        description="A directory the VMs see at the same path (NFS from the head node): job "
        "logs, checkpoints and exit status files. Empty: STATE_DIR/shared.",
    )
    shared_mount: str = Field(
        "",
        description='What a VM mounts at shared_dir, e.g. "head:/var/lib/spotbag/shared" '
        "(NFS); empty: the image or the VM's own setup provides it.",
    )
    hook_secret_file: str = Field(
        "",
        description="The secret slurmctld's hooks sign callbacks with; empty: "
        "STATE_DIR/slurm-hook.secret (made at first start, mode 0600).",
    )
    callback_window_s: float = Field(
        300.0, gt=0, description="Callbacks signed further from now than this are refused."
    )
    command_timeout_s: float = Field(30.0, gt=0, description="Longest wait for one Slurm command.")
    poll_interval_s: float = Field(
        1.0, gt=0, description="How often squeue and sinfo are asked (and at every callback)."
    )
    file_poll_s: float = Field(
        0.2, gt=0, description="How often the shared files (program started, exit status) are read."
    )
    pending_timeout_s: float = Field(
        120.0,
        gt=0,
        description="A job still pending this long after its submission is cancelled and run "
        "again elsewhere (not counted).",
    )
    queue_ahead: float = Field(
        1.0,
        ge=0,
        description="Attempts handed to Slurm beyond what a VM runs at once, as a fraction of "
        "its capacity (1: one more VM-full waits there), so that Slurm starts the next the "
        "moment a job ends; they count as starting, not running. 0: only what fits.",
    )
    unknown_accounts: Literal["cancel", "create"] = Field(
        "cancel",
        description="A pool job whose account spotbag does not know (its Slurm account; "
        "its user name when Slurm gives none or '(null)', as without slurmdbd): cancel (the "
        "job is cancelled, the reason and the command that creates the account in its "
        "comment) or create (the account is created with unknown_account_cpu_h, never "
        "unlimited). [ledger] new_accounts is for bags only.",
    )
    unknown_account_cpu_h: float = Field(
        0.0,
        ge=0,
        description="unknown_accounts = create: the CPU-hours such an account starts with "
        "(0: it exists, and its jobs are cancelled until an admin credits it).",
    )
    pools: tuple[SlurmPoolConfig, ...] = Field(
        (), description="Power-saving pools for Slurm users' own jobs ([[slurm.pools]])."
    )


class NotifyWebhookConfig(_Section):
    url: str = Field(
        pattern=r"^https?://[^/?#\s]+", description="http(s) URL every matching event is POSTed to."
    )
    events: tuple[EventKind, ...] = Field(
        (),
        description="Kinds to send (finished, failed, deadline_at_risk, budget_reached, "
        "preemption_storm); empty: all.",
    )


class NotifyConfig(_Section):
    """Webhooks (docs/notifications.md): events are POSTed as JSON, signed with
    HMAC-SHA256 like the Slurm hooks' callbacks, retried with exponential back-off."""

    webhooks: tuple[NotifyWebhookConfig, ...] = Field(
        (),
        description="The operator's webhooks: every bag's events of their kinds, and the fleet's.",
    )
    secret_file: str = Field(
        "",
        description="File holding the secret events are signed with; empty: "
        "STATE_DIR/notify.secret (made, random, mode 0600, when missing).",
    )
    max_attempts: int = Field(
        8, ge=1, le=100, description="Attempts per delivery before it is given up (failed)."
    )
    backoff_s: float = Field(
        2.0, gt=0, description="Wait before the first retry; doubled after each failure."
    )
    max_backoff_s: float = Field(600.0, gt=0, description="The longest wait between retries.")
    timeout_s: float = Field(10.0, gt=0, description="How long one POST may take.")
    concurrency: int = Field(8, ge=1, le=256, description="POSTs in flight at once.")
    poll_interval_s: float = Field(
        1.0, gt=0, description="How often the delivery worker looks for due deliveries."
    )
    storm_preemptions: int = Field(
        5, ge=1, description="preemption_storm: at least this many preemptions ..."
    )
    storm_window_s: float = Field(600.0, gt=0, description="... within this many seconds.")


class SimulationConfig(_Section):
    tick_s: float | None = Field(
        None,
        gt=0,
        description="spotbag simulate: the scheduler acts at most once per this many "
        "simulated seconds (events in between are handled together); unset: 1/360 of the "
        "bag's job runtime, from 1 to 10 s (a pass's wait then costs a job of that runtime "
        "at most 0.3 % of its time); 1 s for jobs of many lengths (runtime_param) and for "
        "checkpointable bags with notices or a deadline.",
    )
    boot_delay_s: float = Field(
        60.0, ge=0, description="spotbag simulate: VM boot time in seconds."
    )
    notice_lead_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="spotbag simulate: seconds of notice before each preemption (EC2 120, "
        "GCE 30; 0: none).",
    )
    seed: int = Field(
        0, description="spotbag simulate: default seed (runs are deterministic per seed)."
    )
    start_at: float = Field(
        1_767_225_600.0, description="spotbag simulate: epoch seconds the virtual clock starts at."
    )
    projection_every_s: float = Field(
        30.0,
        gt=0,
        description="spotbag simulate: a bag's deadline projection (P(meet), finish "
        "quantiles, deadline_at_risk) at most once per this many simulated seconds, as the "
        "daemon makes it at most every 30 s; it changes no decision, and is most of a long "
        "simulation's time when frequent.",
    )
    price_trace: str = Field(
        "",
        description="spotbag simulate: a spot price trace file (the format of `spotbag data "
        "path spot-prices`); every VM type's spot price then follows one of its series: spot "
        "VMs launch only at or below their bid (the on-demand price), are preempted when the "
        "price rises above it, and are billed the trace's price. Empty: the catalog's fixed "
        "prices.",
    )
    trace_series: str = Field(
        "",
        description="spotbag simulate: the series of price_trace to follow, TYPE/ZONE "
        "(c3.xlarge/us-east-1a); empty: the trace's first.",
    )
    trace_start: str = Field(
        "",
        description="spotbag simulate: the trace time the run starts at (ISO 8601 or epoch "
        "seconds); empty: the first moment every series of the trace has a price.",
    )


class VmTypeConfig(_Section):
    name: str = Field(min_length=1, description="Name jobs may ask for in resources.vm_types.")
    cpus: int = Field(ge=1, description="vCPUs.")
    memory_gb: float = Field(gt=0, description="Memory in GB.")
    gpus: int = Field(0, ge=0, description="GPUs.")
    spot_price_per_hour: float = Field(ge=0, description="Spot price, USD per hour.")
    on_demand_price_per_hour: float = Field(
        0.0, ge=0, description="On-demand price, USD per hour; 0: the driver's price table (aws)."
    )
    zone: str = Field("", description="Zone or region label.")
    instance_type: str = Field(
        "",
        description="The cloud's machine type if `name` is not one (aws, gce): list one type "
        'per zone as e.g. name = "m5.large-1b", instance_type = "m5.large", zone = "us-east-1b".',
    )
    model_key: str = Field(
        "",
        description="Preemption model key (provider/type/zone, e.g. gce/n1-highcpu-16/us-central1-c) "
        "this type behaves like; empty: <driver>/<name>/<zone>.",
    )

    def to_vm_type(self) -> VmType:
        return VmType(**self.model_dump(exclude={"model_key"}))


DEFAULT_VM_TYPES = (
    VmTypeConfig(
        name="local-2",
        cpus=2,
        memory_gb=4.0,
        spot_price_per_hour=0.021,
        on_demand_price_per_hour=0.0832,
        zone="local",
    ),
    VmTypeConfig(
        name="local-8",
        cpus=8,
        memory_gb=32.0,
        spot_price_per_hour=0.11,
        on_demand_price_per_hour=0.384,
        zone="local",
    ),
)


class Config(_Section):
    state_dir: str = Field(
        "",
        description="Where the database, logs and checkpoints live. Empty: "
        "$SPOTBAG_STATE_DIR, else systemd's $STATE_DIRECTORY, else ~/.local/state/spotbag.",
    )
    api: ApiConfig = ApiConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    driver: DriverConfig = DriverConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    ledger: LedgerConfig = LedgerConfig()
    cost: CostConfig = CostConfig()
    hopping: HoppingConfig = HoppingConfig()
    aws: AwsConfig = AwsConfig()
    gce: GceConfig = GceConfig()
    executor: ExecutorConfig = ExecutorConfig()
    slurm: SlurmConfig = SlurmConfig()
    notify: NotifyConfig = NotifyConfig()
    simulation: SimulationConfig = SimulationConfig()
    vm_types: tuple[VmTypeConfig, ...] = Field(
        DEFAULT_VM_TYPES, min_length=1, description="The VM types the local and sim drivers offer."
    )

    @model_validator(mode="after")
    def _sim_executor_on_sim_vms(self) -> Config:
        # Simulated attempts on real VMs would pay for machines that run nothing.
        if self.executor.name == "sim" and self.driver.name != "sim":
            raise ValueError(
                f'executor.name "sim" runs no program and needs driver.name "sim", '
                f'not "{self.driver.name}"'
            )
        return self

    @field_validator("vm_types")
    @classmethod
    def _unique_names(cls, value: tuple[VmTypeConfig, ...]) -> tuple[VmTypeConfig, ...]:
        names = [t.name for t in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate VM type names: {', '.join(duplicates)}")
        return value

    def resolved_state_dir(self) -> Path:
        for candidate in (
            self.state_dir,
            os.environ.get("SPOTBAG_STATE_DIR", ""),
            os.environ.get("STATE_DIRECTORY", "").split(":")[0],
        ):
            if candidate:
                return Path(candidate).expanduser()
        return Path.home() / ".local" / "state" / "spotbag"

    def catalog(self) -> list[VmType]:
        return [t.to_vm_type() for t in self.vm_types]


def load_config(path: str | os.PathLike | None = None, **overrides: Any) -> Config:
    """Read a TOML config (or the defaults when `path` is None) and apply overrides.

    `overrides` are dotted keys (`state_dir`, `api.port`, ...) whose None values
    are ignored, so CLI options can be passed straight through.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'configuration'}: "
            f"{err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise ConfigError(f"config {source}: {problems}") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _render_section(model: type[_Section], values: _Section, lines: list[str]) -> None:
    for name, field in model.model_fields.items():
        value = getattr(values, name)
        # Sections, and lists of them (vm_types), are rendered as tables of their own.
        if isinstance(value, _Section) or name == "vm_types":
            continue
        lines += [f"# {line}" for line in textwrap.wrap(field.description or "", 86)]
        if value is None:
            lines.append(f"# {name} =")
        else:
            lines.append(f"{name} = {_toml_value(value)}")


def render_defaults() -> str:
    """The default configuration as commented TOML (the documentation of every setting)."""
    defaults = Config()
    lines = [
        "# spotbag configuration. Every setting is shown with its default value;",
        "# delete what you do not change. Generated by `spotbag config defaults`.",
        "",
    ]
    _render_section(Config, defaults, lines)
    for name in Config.model_fields:
        value = getattr(defaults, name)
        if isinstance(value, _Section):
            lines += ["", f"[{name}]"]
            _render_section(type(value), value, lines)
    lines += ["", f"# {Config.model_fields['vm_types'].description}"]
    for vm_type in defaults.vm_types:
        lines += ["[[vm_types]]"]
        _render_section(VmTypeConfig, vm_type, lines)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
