"""Offline analyses: what `spotbag` computes from files, never reached by the daemon.

- `checkpoint_plan`: when a job should checkpoint under a VM type's preemption model.
- `hopping_report`: the price index of a spot trace and spot hopping replayed on it.
- `prepaid_report`: how many cores to buy prepaid, from a workload trace.
- `split_cost`: one VM's cost split among the jobs it ran.
- `lifetime_data`, `model_fits`: preemption models fitted to VM lifetimes.
- `plots`: the PNG charts of these tools (matplotlib).

Input files are read through `controller.traces.trace_io` (core: the daemon reads price
traces with it too). Tools may import core modules (config, store, model_book, ...)
but never `controller.scheduler` or `controller.api`, and never the CLI: they raise
their own errors and `controller.cli` turns them into messages and exit codes
(tests/test_architecture.py keeps this true).
"""
