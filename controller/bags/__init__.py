"""Bags on their way in: the bag spec, its validation and its expansion into jobs (spec.py),
one job's command and environment and how large they may get (job_command.py), admitting a
bag (validate, check that some VM type can run it, persist it with its jobs, hand it to
the scheduler: admission.py, shared by the API and `spotbag simulate`), and a bag's
waiting jobs kept without an object per job (waiting_jobs.py).
"""
