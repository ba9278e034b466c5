"""Budgets as a state machine (hypothesis) on the real store: bags of one account start
and end attempts in any interleaving, their caps and the account's are raised, the
daemon restarts. Every attempt is refused exactly when the store's own sums say it would
pass a cap (so launches stop exactly at it, not before), the caps are never passed, and
a restart rebuilds the same book from the store."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controller.bags.spec import parse_bag
from controller.bags.waiting_jobs import FreshParams, JobQueue
from controller.budgets import Budgets, month_of, month_start
from controller.scheduler.runs import BagRun, VmRun, shape_of
from controller.store import Store
from drivers.base import VmState, VmType
from policies.budget_rules import cost_usd, would_cross

NOW = 1_800_000_000.0  # 2027-01-15
MONTH = month_of(NOW)
CAPS = st.one_of(st.none(), st.floats(0.01, 2.0))


def _bag(bag_id: str, cpus: int, max_runtime_s: float) -> BagRun:
    spec = parse_bag(
        {
            "account": "a",
            "command": "true",
            "max_runtime_s": max_runtime_s,
            "resources": {"cpus": cpus, "memory_gb": 1.0},
        }
    ).spec
    return BagRun(bag_id, spec, shape_of(spec), JobQueue(0), FreshParams(), 1000, 0)


class BudgetMachine(RuleBasedStateMachine):
    @initialize(account_cap=CAPS)
    def open_store(self, account_cap):
        self.dir = Path(tempfile.mkdtemp(prefix="spotbag-budgets-"))
        self.loop = asyncio.new_event_loop()
        self.store = Store(self.dir / "spotbag.db", threaded=False, durable=False)
        self.run(self.store.open())
        self.run(self.store.create_account({"name": "a", "unlimited": True, "created_at": NOW}, []))
        self.budgets = Budgets()
        self.account_cap = account_cap
        self.run(self.store.set_account_budget("a", account_cap, NOW))
        self.budgets.set_account_cap("a", account_cap)
        self.bags: dict[str, BagRun] = {}
        self.caps: dict[str, float | None] = {}
        self.running: list[tuple[str, int, int]] = []
        self.jobs = 0
        self.refused = self.started = 0

    def teardown(self):
        if hasattr(self, "store"):
            self.run(self.store.close())
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def sums(self, where: str, args: tuple) -> tuple[float, float]:
        """(charged, reserved and not settled) from the store's budget_reservations alone."""

        def select(conn):
            charged, reserved = conn.execute(
                "SELECT sum(charged_usd), sum(CASE WHEN settled_at IS NULL THEN reserved_usd END) "
                f"FROM budget_reservations WHERE {where}",
                args,
            ).fetchone()
            return charged or 0.0, reserved or 0.0

        return self.run(self.store.read(select))

    def write(self, entries) -> None:
        batch = self.store.new_batch()
        batch.budget_entries(NOW, entries)
        self.run(self.store.apply(batch))

    @rule(cap=CAPS, cpus=st.sampled_from([1, 2]), runtime=st.sampled_from([600.0, 3600.0, 7200.0]))
    def add_bag(self, cap, cpus, runtime):
        bag_id = f"b{len(self.bags):010d}"
        row = {
            "id": bag_id,
            "account": "a",
            "name": "",
            "spec": "{}",
            "state": "active",
            "job_count": 1000,
            "created_at": NOW,
            "budget_usd": cap,
        }
        self.run(self.store.create_bag(row, ["{}"], None))
        self.bags[bag_id] = _bag(bag_id, cpus, runtime)
        self.caps[bag_id] = cap
        self.budgets.open_bag(bag_id, cap)

    @precondition(lambda self: self.bags)
    @rule(
        data=st.data(),
        price=st.floats(0.0, 0.5),
        vm_cpus=st.sampled_from([2, 4, 8]),
    )
    def start_attempt(self, data, price, vm_cpus):
        bag = self.bags[data.draw(st.sampled_from(sorted(self.bags)))]
        # A type's name says its size, as in a catalog (names are unique there; the
        # budgets' worst-case cost is kept by type name and price).
        vm_type = VmType(f"t{vm_cpus}", vm_cpus, 64.0, spot_price_per_hour=price)
        vm = VmRun("vm-1", vm_type, VmState.RUNNING, NOW)
        self.jobs += 1
        idx, number = self.jobs, 1
        share = max(bag.shape.cpus / vm_cpus, 1.0 / 64.0)
        needed = cost_usd(price, share, bag.spec.max_runtime_s)
        bag_charged, bag_open = self.sums("bag_id = ?", (bag.id,))
        month_charged, _ = self.sums("account = ? AND month = ?", ("a", MONTH))
        _, account_open = self.sums("account = ?", ("a",))
        limited = self.caps[bag.id] is not None or self.account_cap is not None
        crosses = would_cross(bag_charged, bag_open, needed, self.caps[bag.id]) or would_cross(
            month_charged, account_open, needed, self.account_cap
        )
        entries = self.budgets.reserve_attempt(bag, vm, idx, number, NOW)
        # Refused exactly when the store's sums say the attempt would pass a cap.
        assert (entries is None) == crosses
        if entries is None:
            self.refused += 1
            assert bag.id in self.budgets.held
            return
        self.started += 1
        assert len(entries) == (1 if limited else 0)
        if entries:
            assert entries[0].usd == pytest.approx(needed)
            self.write(entries)
            self.running.append((bag.id, idx, number))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), fraction=st.floats(0.0, 1.5))
    def end_attempt(self, data, fraction):
        bag_id, idx, number = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        bag = self.bags[bag_id]
        entries = self.budgets.settle_attempt(
            bag, idx, number, fraction * bag.spec.max_runtime_s, NOW
        )
        assert [e.kind for e in entries] == ["charge", "release"]
        self.write(entries)

    @precondition(lambda self: self.bags)
    @rule(data=st.data(), more=st.one_of(st.none(), st.floats(0.0, 1.0)))
    def raise_a_bag_budget(self, data, more):
        bag_id = data.draw(st.sampled_from(sorted(self.bags)))
        cap = self.caps[bag_id]
        new = None if more is None or cap is None else cap + more
        self.run(self.store.set_bag_budget(bag_id, new, NOW))
        self.budgets.set_bag_cap(bag_id, new)
        self.caps[bag_id] = new

    @rule(more=st.one_of(st.none(), st.floats(0.0, 1.0)))
    def raise_the_account_budget(self, more):
        new = None if more is None or self.account_cap is None else self.account_cap + more
        self.run(self.store.set_account_budget("a", new, NOW))
        self.budgets.set_account_cap("a", new)
        self.account_cap = new

    @rule()
    def restart(self):
        before = self.budgets.book
        budgets = Budgets()
        budgets.load(self.run(self.store.budget_state(MONTH, month_start(NOW))), NOW)
        after = budgets.book
        assert after.open.keys() == before.open.keys()
        assert after.bag_caps == {b: c for b, c in before.bag_caps.items()}
        assert after.account_caps == before.account_caps
        for bag_id in self.bags:
            assert after.bag_spent.get(bag_id, 0.0) == pytest.approx(
                before.bag_spent.get(bag_id, 0.0), abs=1e-12
            )
            assert after.bag_committed.get(bag_id, 0.0) == pytest.approx(
                before.bag_committed.get(bag_id, 0.0), abs=1e-12
            )
        self.budgets = budgets

    @invariant()
    def caps_are_never_passed(self):
        if not hasattr(self, "store"):
            return
        for bag_id, cap in self.caps.items():
            charged, reserved = self.sums("bag_id = ?", (bag_id,))
            assert charged >= 0 and reserved >= -1e-12
            if cap is not None:
                assert charged + reserved <= cap * (1 + 1e-9) + 1e-9
        if self.account_cap is not None:
            charged, reserved = self.sums("account = ?", ("a",))
            assert charged + reserved <= self.account_cap * (1 + 1e-9) + 1e-9


TestBudgetMachine = BudgetMachine.TestCase
TestBudgetMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_an_attempt_that_reaches_the_cap_exactly_starts_and_the_next_does_not():
    budgets = Budgets()
    bag = _bag("b0000000001", 1, 3600.0)
    budgets.open_bag(bag.id, 0.10)
    vm = VmRun("vm-1", VmType("t", 2, 64.0, spot_price_per_hour=0.1), VmState.RUNNING, NOW)
    first = budgets.reserve_attempt(bag, vm, 0, 1, NOW)  # half the VM for an hour: $0.05
    second = budgets.reserve_attempt(bag, vm, 1, 1, NOW)  # $0.10: the cap, exactly
    assert first is not None and second is not None
    assert budgets.reserve_attempt(bag, vm, 2, 1, NOW) is None  # $0.15
    assert budgets.held[bag.id].why == (
        "bag b0000000001: spent $0.00 + committed $0.10 + next attempt $0.05 would pass its "
        "budget $0.10"
    )
    assert [h[0] for h in budgets.take_new_holds()] == [bag.id]
    # Half an hour of the first: charged $0.025, $0.025 released; the second ends
    # before it ran (charged nothing): $0.025 spent, nothing committed, the next fits.
    charged = budgets.settle_attempt(bag, 0, 1, 1800.0, NOW)
    assert [(e.kind, round(e.usd, 6)) for e in charged] == [("charge", 0.025), ("release", 0.025)]
    assert budgets.reserve_attempt(bag, vm, 2, 1, NOW) is None  # 0.025 + 0.05 + 0.05
    budgets.settle_attempt(bag, 1, 1, 0.0, NOW)
    assert budgets.reserve_attempt(bag, vm, 2, 1, NOW) is not None  # 0.025 + 0.05
    assert bag.id not in budgets.held
    assert budgets.reserve_attempt(bag, vm, 3, 1, NOW) is None  # 0.025 + 0.05 + 0.05
    assert budgets.take_new_holds() == []  # told once until its budget changes
    budgets.set_bag_cap(bag.id, 1.0)
    assert budgets.reserve_attempt(bag, vm, 3, 1, NOW) is not None
    assert budgets.bag_view(bag.id, "a")["reserved_usd"] == pytest.approx(0.1)
