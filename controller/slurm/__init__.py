"""Slurm as spotbag's distributed engine: its command-line tools, node and job names,
the slurm.conf fragment, signed callbacks from slurmctld's hooks, and power-saving
pools of spot VMs for Slurm users' own jobs. The executor itself is
controller/executors/slurm/."""
