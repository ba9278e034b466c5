"""What cost reports are built from (controller/costs/report.py prices and splits it): the
bags, VMs, attempts, price samples and Slurm pool runs in a report's scope; and the
bags' final costs, kept (controller/costs/bag_cost.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from controller.store.engine import Engine


class ReportQueries(Engine):
    """The report read."""

    async def report_rows(
        self,
        *,
        bag_id: str | None = None,
        account: str | None = None,
        bag_ids: Sequence[str] | None = None,
    ) -> dict:
        """What a cost report of one bag, one account or a set of bags (`bag_ids`: the
        bag views' costs, controller/costs/bag_cost.py) is built from, as tuples:

        - bags: the bags in scope (id, name, account, state, job_count, created_at,
          finished_at, checkpoints, cpus, gpus, memory_gb), plus every other bag that
          shared a VM with them (their jobs split those VMs' costs), `in_scope` 0/1;
        - vms: every VM an attempt in scope ran on (id, vm_type, zone, spot, state,
          reason, cpus, gpus, memory_gb, spot and on-demand price per hour,
          requested_at, running_at, ended_at);
        - attempts: every attempt on those VMs (bag_id, idx, number, vm_id, state,
          started_at, ended_at, lost_from: its last written checkpoint or its start,
          checkpoint_s: the time its written checkpoints took, checkpoints: how many).

        Runs of Slurm users' jobs on power-saving pools count as bags of one job with one
        attempt (id: the run's key), in scope when of the account: their CPUs, and the
        share of their VM's memory those CPUs stand for.
        """
        if sum(scope is not None for scope in (bag_id, account, bag_ids)) != 1:
            raise ValueError("a report is of one bag, one account or a set of bags")
        if bag_ids is not None:
            scope_sql = "SELECT id FROM bags WHERE id IN (SELECT value FROM json_each(:bags))"
        else:
            scope_sql = "SELECT id FROM bags WHERE " + (
                "id = :bag" if bag_id else "account = :account"
            )
        params: dict[str, Any] = {
            "bag": bag_id,
            "account": account,
            "bags": json.dumps(list(bag_ids or ())),
        }
        # The scope's VMs, passed back as a JSON list (read connections are query-only:
        # no temporary table), so each query below looks them up by index.
        on_vms = "(SELECT value FROM json_each(:vms))"

        runs_scope = "r.account = :account" if account is not None else "0"

        def select(conn: sqlite3.Connection) -> dict:
            vm_ids = [
                row[0]
                for row in conn.execute(
                    f"SELECT DISTINCT vm_id FROM attempts WHERE bag_id IN ({scope_sql}) "
                    f"UNION SELECT vm_id FROM slurm_runs r WHERE {runs_scope} AND vm_id != ''",
                    params,
                )
            ]
            params["vms"] = json.dumps(vm_ids)
            bags = conn.execute(
                "SELECT id, name, account, state, job_count, created_at, finished_at, "
                "checkpoints, coalesce(json_extract(spec, '$.resources.cpus'), 1), "
                "coalesce(json_extract(spec, '$.resources.gpus'), 0), "
                "coalesce(json_extract(spec, '$.resources.memory_gb'), 1.0), "
                f"id IN ({scope_sql}) FROM bags WHERE id IN ({scope_sql}) OR id IN "
                f"(SELECT DISTINCT bag_id FROM attempts WHERE vm_id IN {on_vms}) "
                "ORDER BY created_at, id",
                params,
            ).fetchall()
            vms = conn.execute(
                "SELECT id, vm_type, zone, spot, state, reason, cpus, gpus, memory_gb, "
                "spot_price_per_hour, on_demand_price_per_hour, requested_at, running_at, ended_at "
                f"FROM vms WHERE id IN {on_vms} ORDER BY requested_at, id",
                params,
            ).fetchall()
            # The scope's attempts (by primary key), with their checkpoints ...
            attempts = conn.execute(
                "SELECT a.bag_id, a.idx, a.number, a.vm_id, a.state, a.started_at, "
                "a.ended_at, coalesce(c.last_at, a.started_at), coalesce(c.took_s, 0), "
                "coalesce(c.n, 0) FROM attempts a LEFT JOIN (SELECT bag_id, idx, number, "
                "max(at) AS last_at, sum(max(0, at - requested_at)) AS took_s, count(*) AS n "
                f"FROM checkpoints WHERE ok = 1 AND bag_id IN ({scope_sql}) "
                "GROUP BY bag_id, idx, number) c USING (bag_id, idx, number) "
                f"WHERE a.bag_id IN ({scope_sql})",
                params,
            ).fetchall()
            # ... and the other bags' attempts on the same VMs (they share the cost), if
            # there are other bags (a simulation's one bag: 0.2 s to find none).
            others = conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM bags WHERE id NOT IN ({scope_sql}))", params
            ).fetchone()[0]
            if others:
                attempts += conn.execute(
                    "SELECT bag_id, idx, number, vm_id, state, started_at, ended_at, "
                    f"started_at, 0, 0 FROM attempts WHERE vm_id IN {on_vms} "
                    f"AND bag_id NOT IN ({scope_sql})",
                    params,
                ).fetchall()
            # The spot prices sampled while those VMs lived, and every type's size, for the index.
            first, last = conn.execute(
                f"SELECT min(requested_at), max(coalesce(ended_at, 1e300)) FROM vms WHERE id IN {on_vms}",
                params,
            ).fetchone()
            prices = _prices_between(conn, first, last)
            sizes = conn.execute(
                "SELECT vm_type, max(cpus), max(memory_gb), max(on_demand_price_per_hour) "
                "FROM vms GROUP BY vm_type"
            ).fetchall()
            # Pool runs of the account, and every run on the scope's VMs (they share them).
            runs = conn.execute(
                "SELECT r.key, r.job_id, r.job_name, r.account, r.state, r.started_at, "
                "r.ended_at, r.cpus, coalesce(v.memory_gb * r.cpus / v.cpus, 0), "
                f"{runs_scope}, r.vm_id FROM slurm_runs r LEFT JOIN vms v ON v.id = r.vm_id "
                f"WHERE ({runs_scope}) OR r.vm_id IN {on_vms} ORDER BY r.started_at",
                params,
            ).fetchall()
            for key, job_id, name, acct, state, start, end, cpus, memory, mine, vm in runs:
                bag_state = "active" if state == "running" else state
                bags.append(
                    (key, f"Slurm job {job_id} ({name})", acct, bag_state, 1, start, end,
                     0, cpus, 0, memory, int(bool(mine)))
                )  # fmt: skip
                if vm:
                    attempts.append((key, 0, 1, vm, state, start, end, start, 0, 0))
            return {
                "bags": bags,
                "vms": vms,
                "attempts": attempts,
                "prices": prices,
                "sizes": sizes,
            }

        return await self.read(select)

    async def fleet_cost_rows(self, known: Collection[str] = ()) -> dict:
        """What the fleet's costs (controller/costs/fleet_cost.py) are priced from, as tuples:
        every VM that ran but those in `known` (the columns of `report_rows`' vms), and
        the spot prices of their types sampled while they lived (as `report_rows`' are:
        the same samples for every VM they share)."""

        def select(conn: sqlite3.Connection) -> dict:
            vms = [
                vm
                for vm in conn.execute(
                    "SELECT id, vm_type, zone, spot, state, reason, cpus, gpus, memory_gb, "
                    "spot_price_per_hour, on_demand_price_per_hour, requested_at, running_at, "
                    "ended_at FROM vms WHERE running_at IS NOT NULL ORDER BY requested_at, id"
                )
                if vm[0] not in known
            ]
            first = min((vm[11] for vm in vms), default=None)
            last = max((1e300 if vm[13] is None else vm[13] for vm in vms), default=None)
            types = sorted({vm[1] for vm in vms if vm[3]})
            return {
                "vms": vms,
                "prices": _prices_between(conn, first, last, types),
                "fingerprint": _vm_set_fingerprint(conn),
            }

        return await self.read(select)

    async def vm_set_fingerprint(self) -> tuple:
        """What changes whenever a VM starts running or ends (see `_vm_set_fingerprint`)."""
        return await self.read(_vm_set_fingerprint)

    async def final_bag_costs(self, bag_ids: Sequence[str], rule: str) -> list[tuple]:
        """The kept final costs of these bags computed under `rule`: (bag_id, vm_h,
        spot_cost_usd, on_demand_cost_usd, as_of)."""

        def select(conn: sqlite3.Connection) -> list[tuple]:
            return conn.execute(
                "SELECT bag_id, vm_h, spot_cost_usd, on_demand_cost_usd, as_of "
                "FROM final_bag_costs WHERE rule = ? AND bag_id IN "
                "(SELECT value FROM json_each(?))",
                (rule, json.dumps(list(bag_ids))),
            ).fetchall()

        return await self.read(select)

    async def keep_final_bag_costs(self, rule: str, costs: Sequence[tuple]) -> None:
        """Keep bags' final costs: (bag_id, vm_h, spot_cost_usd, on_demand_cost_usd, as_of)."""

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR REPLACE INTO final_bag_costs "
                "(bag_id, rule, vm_h, spot_cost_usd, on_demand_cost_usd, as_of) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(bag_id, rule, *figures) for bag_id, *figures in costs],
            )

        await self.write(insert)


def _prices_between(
    conn: sqlite3.Connection,
    first: float | None,
    last: float | None,
    vm_types: Sequence[str] | None = None,
) -> list:
    """(vm_type, zone, at, price_per_hour) of the price samples (of `vm_types`, or all)
    from `first` to `last`, oldest first, with each series' last sample at or before
    `first` (its price in effect then): so every VM living in that span is priced from
    the same samples, whichever other VMs (a bag's report, the fleet) it was taken over."""
    if first is None or last is None or (vm_types is not None and not vm_types):
        return []
    of_types = "" if vm_types is None else " AND vm_type IN (SELECT value FROM json_each(:types))"
    return conn.execute(
        "SELECT vm_type, zone, at, price_per_hour FROM ("
        # SQLite: with max(), the bare columns are those of the row holding the max.
        f" SELECT vm_type, zone, max(at) AS at, price_per_hour FROM price_samples"
        f" WHERE at <= :first{of_types} GROUP BY vm_type, zone"
        f" UNION ALL SELECT vm_type, zone, at, price_per_hour FROM price_samples"
        f" WHERE at > :first AND at <= :last{of_types}) ORDER BY at, vm_type, zone",
        {"first": first, "last": last, "types": json.dumps(list(vm_types or ()))},
    ).fetchall()


def _vm_set_fingerprint(conn: sqlite3.Connection) -> tuple:
    """(VMs that ran, the last start, the last end): equal twice only if no VM started
    running or ended in between, so fleet figures kept from the first reading still list
    every VM (controller/costs/fleet_cost.py)."""
    return tuple(
        conn.execute(
            "SELECT count(*), max(running_at), max(ended_at) FROM vms WHERE running_at IS NOT NULL"
        ).fetchone()
    )
