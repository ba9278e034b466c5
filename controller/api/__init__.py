"""The HTTP API (aiohttp, JSON, under /v1): thin handlers over the store and scheduler.

- app.py: `build_app`, the middlewares (errors, auth, counting) and the route table;
- base.py: what the resource modules share (Route, Param, access checks, parsing);
- one module per resource, each with its handlers and routes: bags.py, jobs.py (and
  logs), vms.py (and preemption models), market.py (spot hopping), accounts.py (and
  the ledger), account_tokens.py, reports.py, slurm_events.py (slurmctld's hooks),
  health.py (/healthz, /metrics, /openapi.json);
- openapi.py: the OpenAPI document, built from the route table.
"""
