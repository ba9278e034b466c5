"""How VMs die, as the controller believes it: the book of preemption models (the configured
one, the shipped defaults, or one learned from this controller's own VMs: model_book.py),
the learner that refits them from observed lifetimes and tests them for drift
(learning.py), and the checkpoint tables solved under those models, cached in memory and on
disk so that the scheduler answers "when should this job checkpoint next?" by lookup
(checkpoint_tables.py). The mathematics is in policies/ (preemption, fitting, registry,
checkpoint); this package applies it to the running daemon.
"""
