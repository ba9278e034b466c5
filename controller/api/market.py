"""Spot hopping: the hopper's policy, the live market per VM type (price now, window
mean and deviation, on-demand price, price per unit of size) and its migrations; and
the recorded price samples per type beside the cloud index over them (the web UI's
market page)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
from aiohttp import web

from controller.api.base import Route, bounded, controller_of, int_param, json_response
from controller.api.schemas import Hopping, PriceHistory
from controller.hopper import prices_by_type
from drivers.base import PriceSample, VmType
from policies.index import index_series, normalized_prices

HOPPING_LIMIT = bounded("limit", "At most this many migrations.", 1, 10_000, 200)


async def hopping(request: web.Request) -> web.Response:
    c = controller_of(request)
    limit = int_param(request, HOPPING_LIMIT)
    market = c.running_scheduler.world.market
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


PRICES_SINCE = bounded(
    "since",
    "Only samples taken at or after this time (epoch seconds); default: the hopper's "
    "window before now.",
    0,
    10**11,
    None,
)
PRICES_LIMIT = bounded("limit", "At most this many samples: the newest.", 1, 100_000, 20_000)


async def price_history(request: web.Request) -> web.Response:
    """Per catalog type its price samples, and the cloud index 𝕀(t) at each sampling
    time (policies.index.index_series: the mean normalised price P / sqrt(vCPU·GB) of
    the types priced then, capped prices left out), as the hopper sees them (per type
    its own zone's sample, else the cheapest zone's)."""
    c = controller_of(request)
    since = int_param(request, PRICES_SINCE)
    limit = int_param(request, PRICES_LIMIT)
    now = c.clock.now()
    settings = c.config.hopping
    if since is None:
        since = max(0, int(now - settings.window_s / c.config.driver.time_scale))
    rows, truncated = await c.store.recent_price_samples(float(since), limit)
    # Up to 100,000 samples to group and price: not on the event loop.
    types, index = await asyncio.to_thread(_series, rows, truncated, list(c.catalog))
    return json_response(
        {
            "enabled": settings.enabled,
            "policy": settings.policy,
            "now": now,
            "since": since,
            "truncated": truncated,
            "types": types,
            "index": index,
        }
    )


def _series(
    rows: list[tuple[str, str, float, float]], truncated: bool, catalog: list[VmType]
) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """Per catalog type its samples, and the index at every sampling time."""
    by_time: dict[float, list[PriceSample]] = {}
    for type_name, zone, at, price in rows:
        by_time.setdefault(at, []).append(PriceSample(type_name, zone, price, at))
    times = sorted(by_time)
    if truncated and len(times) > 1:
        times = times[1:]  # the oldest time may have lost some of its samples to `limit`
    position = {t.name: i for i, t in enumerate(catalog)}
    cpus = np.array([t.cpus for t in catalog], dtype=float)
    memory_gb = np.array([t.memory_gb for t in catalog], dtype=float)
    on_demand = np.array([t.on_demand_price_per_hour or math.inf for t in catalog])
    prices = np.full((len(times), len(catalog)), np.nan)
    for j, at in enumerate(times):
        prices[j] = prices_by_type(by_time[at], catalog, position)
    index = index_series(prices, cpus, memory_gb, on_demand) if times else np.array([])
    normalized = normalized_prices(prices, cpus, memory_gb)
    types: list[dict[str, Any]] = []
    for i, vm_type in enumerate(catalog):
        priced = np.flatnonzero(np.isfinite(prices[:, i]))
        types.append(
            {
                "vm_type": vm_type.name,
                "zone": vm_type.zone,
                "cpus": vm_type.cpus,
                "memory_gb": vm_type.memory_gb,
                "size": math.sqrt(vm_type.cpus * vm_type.memory_gb),
                "on_demand": _finite(on_demand[i]),
                "at": [times[j] for j in priced],
                "price": [float(prices[j, i]) for j in priced],
                "normalized": [float(normalized[j, i]) for j in priced],
            }
        )
    return types, {"at": times, "value": [_finite(v) for v in index]}


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
    Route(
        "GET",
        "/v1/hopping/prices",
        price_history,
        "Spot price samples per VM type beside the cloud index over them (bounded: the "
        "newest `limit` samples since `since`).",
        admin_only=True,
        params=(PRICES_SINCE, PRICES_LIMIT),
        responses={200: ("Prices and the index.", PriceHistory)},
    ),
)
