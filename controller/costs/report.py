"""Cost reports of one bag or one account (docs/design.md#cost-reports): where the money went.

Built from the store (`Store.report_rows`): every VM the scope's attempts ran on,
and every attempt on those VMs, of any bag, because jobs that shared a VM split its
cost. The cost of each VM over its billed life (running → ended, or now) is split
among its attempts by the split-cost-allocation method (policies/vm_cost.py); what no
attempt held — idle time (up to the idle timeout after work), spare time (kept
beyond it, as a hot spare) and capacity no running job reserved (unallocated) — is
shared among the bags that used the VM in proportion to their VM-hours on it, so the
reports of all the bags on a VM add up to its whole cost.

Per group (the whole scope, each VM type and market, each bag):

    vm_h = job_vm_h + idle_vm_h + spare_vm_h + unallocated_vm_h
    spot_cost_usd        what was paid (a VM on the on-demand market paid that price)
    on_demand_cost_usd   the same VM-hours at the on-demand price
    savings_usd = on_demand_cost_usd - spot_cost_usd
    lost_h               work preemptions threw away: from each preempted attempt's
                         last written checkpoint (or start) to its end
    checkpoint_h         time spent writing checkpoints that were written
    cpu_h                rate × the attempts' time (what the ledger charges)

The numbers come from arrays (numpy), so a report over 100,000 jobs takes well under
a second; rendering (table, CSV, HTML) is in controller/costs/report_render.py. A bag's
view (GET /v1/bags/{id}) shows its `by_bag` figures of this same computation
(controller/costs/bag_cost.py), so the two never disagree.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.config import Config
from controller.errors import SpotbagError
from controller.store import Store
from policies.allocation import DEFAULT_WEIGHTS, Weights
from policies.index import DEFAULT_CAP_FACTOR as CAP_FACTOR
from policies.ledger_rules import GPU_WEIGHT
from policies.vm_cost import VmCosts, split_vm_costs

# The figures of every group, in the order tables and CSV show them.
METRICS: tuple[tuple[str, str], ...] = (
    ("vms", "VMs"),
    ("vm_h", "VM-hours"),
    ("job_vm_h", "VM-hours running jobs"),
    ("idle_vm_h", "idle VM-hours"),
    ("spare_vm_h", "spare VM-hours (hot spares)"),
    ("unallocated_vm_h", "VM-hours of capacity no job reserved"),
    ("spot_cost_usd", "cost (USD)"),
    ("job_cost_usd", "cost of jobs (USD)"),
    ("idle_cost_usd", "cost of idle time (USD)"),
    ("spare_cost_usd", "cost of spare time (USD)"),
    ("unallocated_cost_usd", "cost of unreserved capacity (USD)"),
    ("on_demand_cost_usd", "on-demand cost of the same hours (USD)"),
    ("savings_usd", "savings (USD)"),
    ("savings_pct", "savings (%)"),
    ("attempts", "attempts"),
    ("preemptions", "attempts preempted"),
    ("vm_preemptions", "VMs preempted"),
    ("lost_h", "hours lost to preemption"),
    ("checkpoint_h", "hours checkpointing"),
    ("checkpoints", "checkpoints"),
    ("cpu_h", "CPU-hours used"),
)
MAX_TIMELINE_VMS = 5000  # VMs listed for the timeline; the figures cover all


class SampledMarket:
    """Spot price samples of the store, per (type, zone) series, with the cloud index
    (docs/design.md#index-tracking) over every type of known size: the mean, at each sample time, of each
    type's cheapest zone price over sqrt(vCPUs·GB), leaving out capped prices."""

    def __init__(
        self,
        series: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
        index_at: np.ndarray,
        index: np.ndarray,
    ) -> None:
        self.series = series
        self.index_at, self.index = index_at, index
        self.count = int(sum(len(at) for at, _ in series.values()))

    @classmethod
    def from_rows(cls, prices: Sequence[tuple], sizes: Sequence[tuple]) -> SampledMarket:
        grouped: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for vm_type, zone, at, price in prices:
            ats, values = grouped.setdefault((vm_type, zone), ([], []))
            ats.append(at)
            values.append(price)
        series = {k: (np.array(a), np.array(v)) for k, (a, v) in grouped.items()}
        size = {t: (c, m, od) for t, c, m, od in sizes if c and m}
        per_time: dict[float, dict[str, float]] = {}
        for vm_type, _, at, price in prices:
            if vm_type in size:
                cheapest = per_time.setdefault(at, {})
                cheapest[vm_type] = min(price, cheapest.get(vm_type, math.inf))
        index_at = np.array(sorted(per_time))
        index = np.array(
            [
                np.mean(
                    [
                        p / math.sqrt(size[t][0] * size[t][1])
                        for t, p in per_time[at].items()
                        if not (size[t][2] and p >= CAP_FACTOR * size[t][2])
                    ]
                    or [math.nan]
                )
                for at in index_at
            ]
        )
        return cls(series, index_at, index)

    def vm_price_samples(
        self, vm_types, zones, spot, start_s, end_s
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(vm index, at, price) for split_vm_costs: each spot VM's type in its zone, else
        in any zone of that type; on-demand VMs keep their price. Each VM gets only the
        samples of its billed life [start_s, end_s): the last at or before its start (the
        price in effect then; split_vm_costs would let it win over earlier ones anyway)
        and those after it, before its end (later ones change nothing), so that a fleet
        of thousands of VMs over a month of samples stays a small array."""
        if not self.series:
            return None
        vm_of, ats, values = [], [], []
        by_type: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for (vm_type, _), series in self.series.items():
            by_type.setdefault(vm_type, []).append(series)
        any_zone: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for v, (vm_type, zone, is_spot, start, end) in enumerate(
            zip(vm_types, zones, spot, start_s, end_s, strict=True)
        ):
            if not is_spot:
                continue
            pair = self.series.get((vm_type, zone))
            if pair is None and vm_type in by_type:
                pair = any_zone.get(vm_type)
                if pair is None:
                    pairs = by_type[vm_type]
                    merged = (
                        np.concatenate([a for a, _ in pairs]),
                        np.concatenate([p for _, p in pairs]),
                    )
                    order = np.argsort(merged[0], kind="stable")
                    pair = any_zone[vm_type] = (merged[0][order], merged[1][order])
            if pair is None:
                continue
            lo = max(int(np.searchsorted(pair[0], start, side="right")) - 1, 0)
            hi = int(np.searchsorted(pair[0], end, side="left"))
            if hi <= lo:
                continue
            vm_of.append(np.full(hi - lo, v))
            ats.append(pair[0][lo:hi])
            values.append(pair[1][lo:hi])
        if not vm_of:
            return None
        return np.concatenate(vm_of), np.concatenate(ats), np.concatenate(values)

    def index_cost_usd(self, start_s, end_s, cpus, memory_gb) -> np.ndarray:
        """∫ 𝕀(t) dt × sqrt(C·M) over each [start, end] (USD; NaN where no index covers
        it). 𝕀 is a step function from each sample time on; before the first, unknown."""
        start_s, end_s = np.asarray(start_s, float), np.asarray(end_s, float)
        result = np.full(len(start_s), np.nan)
        valid = ~np.isnan(self.index)
        if not valid.any():
            return result
        at, index = self.index_at[valid], self.index[valid]
        cumulative = np.concatenate([[0.0], np.cumsum(index[:-1] * np.diff(at))])

        def integral(t: np.ndarray) -> np.ndarray:
            k = np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(at) - 1)
            return cumulative[k] + index[k] * (t - at[k])

        lo = np.maximum(start_s, at[0])
        covered = end_s > lo
        area = np.where(covered, integral(np.maximum(end_s, lo)) - integral(lo), np.nan)
        return area / 3600.0 * np.sqrt(np.asarray(cpus, float) * np.asarray(memory_gb, float))


class ReportScopeEmpty(SpotbagError, LookupError):
    """The bag does not exist, or the account has no bags."""

    status = 404
    code = "not_found"


@dataclass(frozen=True)
class CostRule:
    """The settings of the split (docs/design.md#cost-reports): the resource weights, the idle timeout
    that tells idle from spare time, and the ledger's GPU weight (for CPU-hours). The
    reports and the bag views (controller/costs/bag_cost.py) take the same one from the config,
    so they never disagree."""

    weights: Weights = DEFAULT_WEIGHTS
    idle_timeout_s: float = 0.0
    gpu_weight: float = GPU_WEIGHT

    @classmethod
    def of(cls, config: Config) -> CostRule:
        cost = config.cost
        return cls(
            Weights(cost.cpu_weight, cost.memory_weight, cost.gpu_weight),
            config.scheduler.idle_timeout_s,
            config.ledger.gpu_weight,
        )


async def build_report(
    store: Store,
    *,
    bag_id: str | None = None,
    account: str | None = None,
    bag_ids: Sequence[str] | None = None,
    now: float,
    rule: CostRule = CostRule(),
) -> dict[str, Any]:
    """The report of a bag, of an account or of a set of bags (the arithmetic runs off
    the event loop)."""
    rows = await store.report_rows(bag_id=bag_id, account=account, bag_ids=bag_ids)
    scope: dict[str, Any]
    if bag_ids is not None:
        scope = {"bags": list(bag_ids)}
    else:
        scope = {"bag": bag_id} if bag_id is not None else {"account": account}
    return await asyncio.to_thread(compute_report, rows, scope, now, rule)


def compute_report(
    rows: dict[str, list[tuple]],
    scope: dict[str, Any],
    now: float,
    rule: CostRule = CostRule(),
) -> dict[str, Any]:
    weights, idle_timeout_s, gpu_weight = rule.weights, rule.idle_timeout_s, rule.gpu_weight
    bags = rows["bags"]
    if not any(bag[11] for bag in bags):
        if "bag" in scope:
            what = f"bag {scope['bag']}"
        elif "bags" in scope:
            what = f"bags {', '.join(scope['bags']) or '(none)'}"
        else:
            what = f"account {scope['account']!r}"
        raise ReportScopeEmpty(f"{what} has nothing to report (no such bag, or no bags)")
    bag_index = {bag[0]: i for i, bag in enumerate(bags)}
    bag_resources = np.array([(b[8], b[10], b[9]) for b in bags], dtype=float).reshape(-1, 3)
    bag_in_scope = np.array([bool(b[11]) for b in bags])

    vms = rows["vms"]
    vm_index = {vm[0]: i for i, vm in enumerate(vms)}
    vm_cols, running, ended, capacity, spot, paid, on_demand = _vm_arrays(vms, now)
    vm_preempted = np.array([state == "preempted" for state in vm_cols[4]], dtype=bool)
    type_names = [
        f"{t} ({'spot' if s else 'on-demand'})" for t, s in zip(vm_cols[1], spot, strict=True)
    ]

    attempts = [a for a in rows["attempts"] if a[3] in vm_index]
    # Column by column: zip(*attempts) over 100,000 rows took 70-210 ms, this ~40.
    a_cols = [[a[k] for a in attempts] for k in range(10)]
    a_vm = np.array([vm_index[v] for v in a_cols[3]], dtype=np.int64)
    a_bag = np.array([bag_index[b] for b in a_cols[0]], dtype=np.int64)
    a_start = np.array(a_cols[5], dtype=float)
    a_end = np.array([now if e is None else e for e in a_cols[6]], dtype=float)
    a_reserved = bag_resources[a_bag] if len(a_bag) else np.zeros((0, 3))

    market = SampledMarket.from_rows(rows.get("prices", ()), rows.get("sizes", ()))
    costs = split_vm_costs(
        running,
        ended,
        capacity,
        paid,
        on_demand,
        a_vm,
        np.clip(a_start, running[a_vm], ended[a_vm]) if len(a_vm) else a_start,
        np.clip(a_end, running[a_vm], ended[a_vm]) if len(a_vm) else a_end,
        a_reserved,
        weights=weights,
        idle_timeout_s=idle_timeout_s,
        price_samples=market.vm_price_samples(vm_cols[1], vm_cols[2], spot, running, ended),
    )
    # The index beside the price paid: ∫ 𝕀(t)·sqrt(C·M) dt over each VM's billed life.
    index_usd = market.index_cost_usd(running, ended, capacity[:, 0], capacity[:, 1])

    # Each attempt carries its share of its VM's time that no attempt held: its
    # VM-hours over all the attempts' VM-hours on that VM (by count if those are 0).
    per_vm_job_h = np.bincount(a_vm, costs.attempt_vm_h, minlength=len(vms))
    per_vm_count = np.bincount(a_vm, minlength=len(vms)).astype(float)
    share = np.where(
        per_vm_job_h[a_vm] > 0,
        costs.attempt_vm_h / np.where(per_vm_job_h[a_vm] > 0, per_vm_job_h[a_vm], 1.0),
        1.0 / np.maximum(per_vm_count[a_vm], 1.0),
    )

    preempted = np.array([state == "preempted" for state in a_cols[4]], dtype=bool)
    elapsed_s = np.maximum(0.0, a_end - a_start)
    lost_from = np.array(a_cols[7], dtype=float)
    rate = bag_resources[a_bag, 0] + gpu_weight * bag_resources[a_bag, 2] if len(a_bag) else a_end
    overhead = {
        "idle_vm_h": costs.idle_h,
        "spare_vm_h": costs.spare_h,
        "unallocated_vm_h": costs.unallocated_h,
        "idle_cost_usd": costs.idle_cost_usd,
        "spare_cost_usd": costs.spare_cost_usd,
        "unallocated_cost_usd": costs.unallocated_cost_usd,
    }
    columns: dict[str, np.ndarray] = {
        "job_vm_h": costs.attempt_vm_h,
        "job_cost_usd": costs.attempt_cost_usd,
        **{name: share * per_vm[a_vm] for name, per_vm in overhead.items()},
        "on_demand_cost_usd": costs.attempt_on_demand_usd
        + share
        * (costs.idle_on_demand_usd + costs.spare_on_demand_usd + costs.unallocated_on_demand_usd)[
            a_vm
        ],
        "attempts": np.ones(len(a_vm)),
        "preemptions": preempted.astype(float),
        "lost_h": np.where(preempted, np.maximum(0.0, a_end - lost_from), 0.0) / 3600.0,
        "checkpoint_h": np.array(a_cols[8], dtype=float) / 3600.0,
        "checkpoints": np.array(a_cols[9], dtype=float),
        "cpu_h": rate * elapsed_s / 3600.0,
    }
    mine = bag_in_scope[a_bag] if len(a_bag) else np.zeros(0, dtype=bool)
    columns = {name: values[mine] for name, values in columns.items()}
    a_vm, a_bag = a_vm[mine], a_bag[mine]

    type_codes, type_of_vm = np.unique(np.array(type_names, dtype=object), return_inverse=True)
    by_type = _grouped(columns, type_of_vm[a_vm], len(type_codes), a_vm, vm_preempted)
    by_bag = _grouped(columns, a_bag, len(bags), a_vm, vm_preempted)
    totals = _grouped(columns, np.zeros(len(a_vm), dtype=np.int64), 1, a_vm, vm_preempted)[0]

    used_vms = np.unique(a_vm)

    def _paid_and_index(k: int) -> dict[str, float | None]:
        """Mean price paid per VM-hour by the type's VMs, and the index price for their
        size over the same hours (None without price samples)."""
        of_type = used_vms[type_of_vm[used_vms] == k]
        life_h = float(costs.life_h[of_type].sum())
        covered = of_type[~np.isnan(index_usd[of_type])]
        covered_h = float(costs.life_h[covered].sum())
        return {
            "price_paid_per_h": float(costs.cost_usd[of_type].sum()) / life_h if life_h else None,
            "index_price_per_h": float(index_usd[covered].sum()) / covered_h if covered_h else None,
        }

    timeline = [
        {
            "id": vms[v][0],
            "vm_type": vms[v][1],
            "market": "spot" if spot[v] else "on-demand",
            "requested_at": vms[v][11],
            "start": float(running[v]),
            "end": float(ended[v]),
            "state": vms[v][4],
            "reason": vms[v][5],
        }
        for v in used_vms[:MAX_TIMELINE_VMS]
    ]
    return {
        "scope": scope,
        "generated_at": now,
        "currency": "USD",
        "split_weights": {"cpu": weights.cpu, "memory": weights.memory, "gpu": weights.gpu},
        "idle_timeout_s": idle_timeout_s,
        "totals": totals,
        "by_vm_type": [
            {"vm_type": str(type_codes[k]), **group, **_paid_and_index(k)}
            for k, group in enumerate(by_type)
            if group["attempts"]
        ],
        "price_samples": market.count,
        "by_bag": [
            {
                "bag_id": bags[b][0],
                "name": bags[b][1],
                "account": bags[b][2],
                "state": bags[b][3],
                "jobs": bags[b][4],
                "created_at": bags[b][5],
                "finished_at": bags[b][6],
                **by_bag[b],
            }
            for b in range(len(bags))
            if bag_in_scope[b]
        ],
        "vms": timeline,
        "vms_truncated": len(used_vms) > MAX_TIMELINE_VMS,
    }


def _vm_arrays(
    vms: Sequence[tuple], now: float
) -> tuple[list, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The columns of VM rows (`Store.report_rows`' vms), and as arrays each VM's
    billed life as of `now` (running → ended, or now), capacity (cpu, memory_gb, gpu),
    market (spot or not), the price it pays per hour and the on-demand price."""
    vm_cols = list(zip(*vms, strict=True)) if vms else [()] * 14
    ended = np.array([now if e is None else e for e in vm_cols[13]], dtype=float)
    running = np.array(
        [e if r is None else r for r, e in zip(vm_cols[12], ended, strict=True)], dtype=float
    )
    running = np.minimum(running, ended)
    capacity = np.array(
        list(zip(vm_cols[6], vm_cols[8], vm_cols[7], strict=True)), dtype=float
    ).reshape(-1, 3)
    spot = np.array(vm_cols[3], dtype=bool)
    # A VM on the on-demand market pays the on-demand price.
    paid = np.where(spot, np.array(vm_cols[9], dtype=float), np.array(vm_cols[10], dtype=float))
    on_demand = np.array(vm_cols[10], dtype=float)
    return vm_cols, running, ended, capacity, spot, paid, on_demand


def vm_costs(vms: Sequence[tuple], prices: Sequence[tuple], now: float) -> VmCosts:
    """What each VM cost over its billed life up to `now`, by the reports' rule: the
    per-VM figures (life_h, cost_usd = ∫ price dt, on_demand_usd) of the same
    split_vm_costs call, with the same price samples (SampledMarket.vm_price_samples:
    a spot VM pays its type's sampled price in its zone, its own price before the first
    sample), that a report splits among attempts. A VM's cost does not depend on who
    ran on it, so no attempt is passed. `vms`: rows as `Store.report_rows`' vms;
    `prices`: its prices over (at least) those VMs' lives."""
    vm_cols, running, ended, capacity, spot, paid, on_demand = _vm_arrays(vms, now)
    market = SampledMarket.from_rows(prices, ())
    return split_vm_costs(
        running,
        ended,
        capacity,
        paid,
        on_demand,
        np.zeros(0, dtype=np.int64),
        np.zeros(0),
        np.zeros(0),
        np.zeros((0, 3)),
        price_samples=market.vm_price_samples(vm_cols[1], vm_cols[2], spot, running, ended),
    )


def _grouped(
    columns: dict[str, np.ndarray],
    group: np.ndarray,
    n_groups: int,
    attempt_vm: np.ndarray,
    vm_preempted: np.ndarray,
) -> list[dict[str, Any]]:
    """Sum every column per group; count each group's distinct VMs and preempted VMs."""
    sums = {
        name: np.bincount(group, values, minlength=n_groups) for name, values in columns.items()
    }
    # Distinct (group, VM) pairs, as one integer key each (a 1-D unique is fast).
    n_vms = max(len(vm_preempted), 1)
    pairs = np.unique(group.astype(np.int64) * n_vms + attempt_vm)
    pair_groups, pair_vms = np.divmod(pairs, n_vms)
    vm_counts = np.bincount(pair_groups, minlength=n_groups)
    vm_preemptions = np.bincount(
        pair_groups, vm_preempted[pair_vms].astype(float), minlength=n_groups
    )
    out = []
    for k in range(n_groups):
        figures = {name: float(values[k]) for name, values in sums.items()}
        figures["spot_cost_usd"] = (
            figures["job_cost_usd"]
            + figures["idle_cost_usd"]
            + figures["spare_cost_usd"]
            + figures["unallocated_cost_usd"]
        )
        figures["vm_h"] = (
            figures["job_vm_h"]
            + figures["idle_vm_h"]
            + figures["spare_vm_h"]
            + figures["unallocated_vm_h"]
        )
        figures["savings_usd"] = figures["on_demand_cost_usd"] - figures["spot_cost_usd"]
        od = figures["on_demand_cost_usd"]
        row: dict[str, float | int | None] = dict(figures)
        row["savings_pct"] = 100.0 * figures["savings_usd"] / od if od > 0 else None
        row["vms"] = int(vm_counts[k])
        row["vm_preemptions"] = int(vm_preemptions[k])
        for name in ("attempts", "preemptions", "checkpoints"):
            row[name] = round(figures[name])
        out.append({name: row[name] for name, _ in METRICS})
    return out
