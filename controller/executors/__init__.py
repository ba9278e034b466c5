"""Executors: how a job's attempt runs on a VM (local subprocess, simulated, Slurm)."""
