"""Slurm hook scripts (PrologSlurmctld, EpilogSlurmctld, ResumeProgram, SuspendProgram).

They are small stdlib-only programs run by slurmctld that report to the
controller over HTTP; they import nothing else from spotbag. The Slurm
integration issue fills this package.
"""
