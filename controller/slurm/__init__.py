"""Slurm as spotbag's distributed engine, all of it in one package: the executor that runs
attempts as Slurm batch jobs (executor/), slurmctld's hooks' signed callbacks (callbacks.py:
verifying; events.py: applying; routes.py: their HTTP route, joined into the API's table),
Slurm's command-line tools (commands.py), node and job names (naming.py), the slurm.conf
fragment and head-node set-up (conf.py, setup.py, hooks_install.py, and the `spotbag slurm`
commands, cli.py), and power-saving pools of spot VMs for Slurm users' own jobs (pools.py;
the scheduler's side of them is controller/scheduler/slurm_pools.py). The hook scripts
themselves, which run on the head node with the standard library only, are slurm_hooks/.
"""
