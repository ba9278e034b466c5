"""The daemon process's plumbing, none of it about jobs or VMs: telling systemd how the
daemon is doing (sdnotify.py), the Prometheus metrics at /metrics (metrics.py), measuring
how long the event loop was kept from running (loop_lag.py), logging events that come in
bursts once per burst with a count (burst_log.py), and one BLAS thread for spotbag's own
numerical work (blas.py).
"""
