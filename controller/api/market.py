"""Spot hopping: the hopper's policy, the live market per VM type (price now, window
mean and deviation, on-demand price, price per unit of size) and its migrations."""

from __future__ import annotations

import math

from aiohttp import web

from controller.api.base import Route, bounded, controller_of, int_param, json_response
from controller.api.schemas import Hopping

HOPPING_LIMIT = bounded("limit", "At most this many migrations.", 1, 10_000, 200)


async def hopping(request: web.Request) -> web.Response:
    c = controller_of(request)
    limit = int_param(request, HOPPING_LIMIT)
    market = c.running_scheduler.market
    rows = []
    if market is not None:
        for i, name in enumerate(market.names):
            size = math.sqrt(market.cpus[i] * market.memory_gb[i])
            rows.append(
                {
                    "vm_type": name,
                    "price_now": _finite(market.now_price[i]),
                    "price_mean": _finite(market.mean_price[i]),
                    "price_std": _finite(market.std_price[i]),
                    "on_demand": _finite(market.on_demand[i]),
                    "normalized_now": _finite(market.now_price[i] / size),
                }
            )
    return json_response(
        {
            "configured": c.config.hopping.model_dump(),
            "market": rows,
            "migrations": await c.store.list_migrations(limit),
        }
    )


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/v1/hopping",
        hopping,
        "Spot hopping: the policy, the live market per VM type, and every migration with its reason.",
        admin_only=True,
        params=(HOPPING_LIMIT,),
        responses={200: ("Market and migrations.", Hopping)},
    ),
)
