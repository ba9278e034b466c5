"""Executors: how a job's attempt runs on a VM (local subprocess, simulated; the Slurm
executor lives with the rest of Slurm, controller/slurm/executor/), and what they share
(the Executor protocol, attempt files, job users)."""
