"""The HTTP API (aiohttp, JSON, under /v1): thin handlers over the store and scheduler.

- app.py: `build_app`, the middlewares (errors, auth, counting) and the route table;
- base.py: what the resource modules share (Route, Param, access checks, parsing);
- one module per resource, each with its handlers and routes: bags.py, jobs.py (and
  logs), vms.py (and preemption models), market.py (spot hopping), accounts.py (and
  the ledger), account_tokens.py, reports.py, events.py (events and their webhook
  deliveries), health.py (/healthz, /metrics, /openapi.json); slurmctld's hooks call
  a route of the Slurm package (controller/slurm/routes.py);
- openapi.py: the OpenAPI document, built from the route table.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """`from controller.api import build_app` (and ROUTES, server_logger), loading the
    app's modules only then: the daemon imports controller.api.limits before it listens,
    and the app (pydantic schemas, the store, the web UI) once it loads (service.py)."""
    if name in ("ROUTES", "build_app", "server_logger"):
        from controller.api import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
