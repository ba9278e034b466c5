"""The ledger's rules as a state machine (hypothesis): balances always match the entries,
nothing goes negative, every reservation is settled exactly once, repeats change nothing."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies.ledger_rules import (
    Balance,
    InsufficientCredit,
    Ledger,
    jobs_covered,
    rate_cpu_h_per_h,
    reservation_cpu_h,
    settlement,
)

ACCOUNTS = ("a", "b")
EPS = 1e-6


def test_the_spec_example():
    ledger = Ledger()
    ledger.credit("lab", 10_000)
    rate = rate_cpu_h_per_h(32, 0)
    for job in ("j1", "j2"):
        ledger.reserve("lab", job, reservation_cpu_h(rate, 12 * 3600))
    assert ledger.balance("lab").reserved == 768
    for job in ("j1", "j2"):
        ledger.settle(job, rate, 2 * 3600)
    balance = ledger.balance("lab")
    assert (balance.charged, balance.reserved, balance.available) == (128, 0, 9_872)
    assert reservation_cpu_h(rate_cpu_h_per_h(4, 1), 12 * 3600) == 288  # 1 GPU = 20 CPU-h


def test_a_reservation_the_account_cannot_cover_is_refused_and_changes_nothing():
    ledger = Ledger()
    ledger.credit("a", 10)
    ledger.reserve("a", "k1", 6)
    with pytest.raises(InsufficientCredit, match=r"needs 5\.00 CPU-hours but has 4\.00"):
        ledger.reserve("a", "k2", 5)
    with pytest.raises(InsufficientCredit):
        ledger.reserve_many("a", ["k3", "k4"], 3)  # all or nothing
    assert ledger.balance("a") == Balance(10, 0, 6) and set(ledger.open) == {"k1"}
    assert settlement(6, 2.0, 3600 * 5) == (6, 0)  # never charges more than was reserved
    assert settlement(6, 2.0, 3600, charge_it=False) == (0, 6)


any_float = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


@settings(max_examples=2000, deadline=None)
@given(available=any_float, per_job=any_float, count=st.integers(-5, 10**30))
@example(available=50.0, per_job=2.2250738585072014e-308 / 3600, count=10)  # issue 23
@example(available=50.0, per_job=1e-320, count=10)
@example(available=1e308, per_job=1e-308, count=10)
@example(available=math.nan, per_job=1.0, count=3)
@example(available=1.0, per_job=math.nan, count=3)
@example(available=-5.0, per_job=1.0, count=3)
@example(available=math.inf, per_job=math.inf, count=3)
def test_jobs_covered_answers_within_the_job_count_for_any_float(available, per_job, count):
    # Never an error (OverflowError on a tiny reservation was a 500 on admission).
    n = jobs_covered(available, per_job, count)
    assert isinstance(n, int) and 0 <= n <= max(0, count)


balances = st.floats(min_value=0, max_value=1e15, allow_subnormal=True)
per_jobs = st.floats(min_value=0, max_value=1e6, exclude_min=True, allow_subnormal=True)


@settings(max_examples=2000, deadline=None)
@given(available=balances, per_job=per_jobs, count=st.integers(1, 10**7))
@example(available=0.3, per_job=0.1, count=5)  # 0.1 × 3 rounds above 0.3
@example(available=50.0, per_job=1e-320, count=10**6)
def test_jobs_covered_is_exactly_what_the_ledger_will_reserve(available, per_job, count):
    # A held bag reserves jobs_covered(...) jobs at once: the ledger must accept that
    # block, and refuse one job more (else a job was held that could have run).
    n = jobs_covered(available, per_job, count)
    ledger = Ledger()
    ledger.credit("a", available)
    ledger.reserve_block("a", n, per_job)
    if n < count:
        with pytest.raises(InsufficientCredit):
            Ledger(balances={"a": Balance(available)}).reserve_block("a", n + 1, per_job)


class LedgerMachine(RuleBasedStateMachine):
    """Random credits, reservations, settlements, releases and repeats of them."""

    @initialize()
    def start(self) -> None:
        self.ledger = Ledger()
        self.entries = []
        self.keys = 0
        self.settled: set[str] = set()

    def _record(self, entries) -> None:
        self.entries.extend(entries)

    @rule(account=st.sampled_from(ACCOUNTS), cpu_h=st.floats(0, 100))
    def credit(self, account, cpu_h) -> None:
        self._record([self.ledger.credit(account, cpu_h)])

    @rule(account=st.sampled_from(ACCOUNTS), cpu_h=st.floats(0, 60))
    def reserve(self, account, cpu_h) -> None:
        self.keys += 1
        key = f"k{self.keys}"
        before = self.ledger.balance(account).available
        try:
            self._record([self.ledger.reserve(account, key, cpu_h)])
        except InsufficientCredit:
            assert before < cpu_h
            assert key not in self.ledger.open

    @precondition(lambda self: self.ledger.open)
    @rule(
        data=st.data(),
        rate=st.floats(0, 64),
        elapsed_s=st.floats(0, 40 * 3600),
        charge_it=st.booleans(),
    )
    def settle(self, data, rate, elapsed_s, charge_it) -> None:
        key = data.draw(st.sampled_from(sorted(self.ledger.open)))
        entries = self.ledger.settle(key, rate, elapsed_s, charge_it)
        assert [e.kind for e in entries] == ["charge", "release"]
        self.settled.add(key)
        self._record(entries)

    @precondition(lambda self: self.ledger.open)
    @rule(data=st.data())
    def release(self, data) -> None:
        key = data.draw(st.sampled_from(sorted(self.ledger.open)))
        entries = self.ledger.release(key)
        assert [e.kind for e in entries] == ["release"]
        self.settled.add(key)
        self._record(entries)

    @precondition(lambda self: self.settled)
    @rule(data=st.data())
    def repeat(self, data) -> None:
        """A repeated completion event changes nothing."""
        key = data.draw(st.sampled_from(sorted(self.settled)))
        before = {a: Balance(**vars(b)) for a, b in self.ledger.balances.items()}
        assert self.ledger.settle(key, 8.0, 3600.0) == []
        assert self.ledger.release(key) == []
        assert self.ledger.balances == before

    @invariant()
    def balances_are_the_sum_of_the_entries(self) -> None:
        replayed = Ledger()
        for entry in self.entries:
            replayed.apply(entry)
        for account, balance in self.ledger.balances.items():
            again = replayed.balance(account)
            for name in ("allocation", "charged", "reserved"):
                assert math.isclose(getattr(balance, name), getattr(again, name), abs_tol=EPS)
        assert set(replayed.open) == set(self.ledger.open)

    @invariant()
    def nothing_goes_negative_and_the_allocation_is_accounted_for(self) -> None:
        for account, balance in self.ledger.balances.items():
            assert balance.available >= -EPS and balance.reserved >= -EPS
            credited = sum(
                e.cpu_h for e in self.entries if e.kind == "credit" and e.account == account
            )
            charged = sum(
                e.cpu_h for e in self.entries if e.kind == "charge" and e.account == account
            )
            held = sum(c for a, c in self.ledger.open.values() if a == account)
            assert math.isclose(credited, charged + held + balance.available, abs_tol=EPS)

    @invariant()
    def every_reservation_is_released_exactly_once(self) -> None:
        kinds = Counter((e.key, e.kind) for e in self.entries if e.kind != "credit")
        for (key, kind), n in kinds.items():
            assert n == 1, (key, kind)
            if kind == "release":
                assert (key, "reserve") in kinds and key not in self.ledger.open
        for key in self.ledger.open:
            assert (key, "release") not in kinds


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
