"""Big bags and the event loop (issue 14, item 3): admitting a bag builds nothing per job
on the event loop that the garbage collector must walk, and opens the jobs'
reservations in slices, serving others in between. Behaviour, not timings: the
timings are bench/big_bag.py's (2 CPUs shared with other work make them noisy)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.bags import admission as admission_module
from controller.bags.admission import admit
from controller.bags.spec import parse_bag
from controller.bags.waiting_jobs import (
    FreshParams,
    HeldJobs,
    HeldQueue,
    JobQueue,
    PackedParams,
    decode_params,
)
from controller.clock import SimClock
from controller.ledger import first_attempt_keys
from policies.ledger_rules import reservation_key
from tests.controller.simworld import bag, config, rows, world

# A 100,000-job bag each: in `make test`, left out of `make test-fast` (marker slow).
pytestmark = pytest.mark.slow


async def admit_bag(scheduler, cfg, n: int, bag_id: str = "b0000000001") -> None:
    await admit(
        bag(n),
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id=bag_id,
        now=scheduler.clock.now(),
        max_jobs=n,
    )


def walked_containers(at_least: int, *, besides: tuple[object, ...]) -> list[str]:
    """The containers the garbage collector tracks that hold `at_least` items."""
    found = []
    kinds = (list, tuple, deque, dict, set)
    for obj in gc.get_objects():
        kind = next((k for k in kinds if isinstance(obj, k)), None)
        if kind is None or any(obj is b for b in besides):
            continue
        # The base type's length, not len(): a subclass may compute its own (platform's
        # uname_result runs `uname -p` when its length is first asked).
        if kind.__len__(obj) >= at_least:
            found.append(f"{type(obj).__name__} of {len(obj)}")
    return found


async def test_a_big_bag_costs_the_collector_nothing_per_job(tmp_path):
    """A 100,000-job bag admitted and scheduled leaves no tracked container with an
    entry per job: its queue, parameters and reservation keys are a few objects.
    (Before: a deque of 100,000 ints, walked by every full collection; on a 1,000,000-
    job bag 50-100 ms each, a stall of the event loop every second or so.) The open
    reservations are one dict entry per job by design (docs/design.md#ledger): its values are one
    shared tuple, and it is left out here."""
    n = 100_000
    cfg = config()
    scheduler = await world(tmp_path, SimClock(0.0), 1, cfg)
    await admit_bag(scheduler, cfg, n)
    await scheduler.tick()
    open_reservations = scheduler.accounts.ledger.open
    assert len(open_reservations) == n
    gc.collect()
    assert walked_containers(n // 2, besides=(open_reservations,)) == []
    # What is scheduled is still every job, in order, with its parameters.
    (run,) = scheduler.world.bags.values()
    assert len(run.queue) + len(scheduler.world.attempts) == n
    job = scheduler.world.queued_job(run, n - 1)
    assert job.params == {"i": n - 1}
    await scheduler.store.close()


async def test_reservations_are_opened_in_slices_with_the_loop_free_between(tmp_path):
    """The jobs' reservations are opened OPEN_KEYS_CHUNK at a time after the bag is
    written; a task running meanwhile sees them part-opened (before: all at once, a
    million keys holding the loop for ~0.4 s). Balances are whole from the start, and
    the bag reaches the scheduler only once every key is open."""
    chunk = admission_module.OPEN_KEYS_CHUNK
    n = 3 * chunk + 7
    cfg = config()
    scheduler = await world(tmp_path, SimClock(0.0), 1, cfg)
    seen: list[tuple[int, bool]] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            seen.append((len(scheduler.accounts.ledger.open), scheduler.has_inputs()))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await admit_bag(scheduler, cfg, n)
    stop.set()
    await watcher
    partial = sorted({count for count, _ in seen if 0 < count < n})
    assert partial[:3] == [chunk, 2 * chunk, 3 * chunk]
    assert not any(handed for count, handed in seen if count < n)  # not before all open
    assert scheduler.has_inputs()
    account = scheduler.accounts.view("a")
    per_job = scheduler.accounts.per_attempt_cpu_h(parse_bag(bag(n), max_jobs=n).spec)
    assert account["reserved_cpu_h"] == pytest.approx(n * per_job)
    assert set(scheduler.accounts.ledger.open) == {
        reservation_key("b0000000001", idx, 1) for idx in range(n)
    }
    await scheduler.tick()
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT count(*), sum(cpu_h) FROM ledger_open") == [
        (n, pytest.approx(n * per_job))
    ]


# --- the structures themselves ---------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("popleft"), st.just(0)),
        st.tuples(st.just("appendleft"), st.integers(0, 10**6)),
        st.tuples(st.just("append"), st.integers(0, 10**6)),
    ),
    max_size=60,
)


@given(st.integers(0, 20), OPS)
def test_job_queue_is_a_deque_of_its_range(stop, ops):
    queue, model = JobQueue(stop), deque(range(stop))
    for op, arg in ops:
        if op == "popleft":
            if model:
                assert queue.popleft() == model.popleft()
            else:
                with pytest.raises(IndexError):
                    queue.popleft()
        else:
            getattr(queue, op)(arg)
            getattr(model, op)(arg)
        assert len(queue) == len(model) and bool(queue) == bool(model)
        assert list(queue) == list(model)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


@given(st.lists(st.dictionaries(st.text(max_size=3), _JSON_VALUES), max_size=30))
def test_packed_params_are_each_points_compact_json(points):
    packed = PackedParams.encode(iter(points))
    texts = [json.dumps(p, separators=(",", ":")) for p in points]
    assert len(packed) == len(texts) and list(packed) == texts
    assert [packed[i] for i in range(len(texts))] == texts
    assert packed[1:4] == texts[1:4]
    if texts:
        assert packed[-1] == texts[-1]
    with pytest.raises(IndexError):
        packed[len(texts)]
    # (Compared as text: a NaN is not equal to itself.)
    assert [json.dumps(decode_params(text), separators=(",", ":")) for text in packed] == texts


def test_a_point_json_cannot_hold_is_refused_and_the_next_are_not_taken_for_cycles():
    """The packer's one C encoder keeps the containers it is inside; a point that fails
    half way must not leave them marked (the same objects again would be "circular")."""
    inner = {"y": object()}
    point = {"x": inner, "z": [inner]}
    with pytest.raises(TypeError, match="not JSON serializable"):
        PackedParams.encode([point])
    inner["y"] = 1
    assert list(PackedParams.encode([point])) == ['{"x":{"y":1},"z":[{"y":1}]}']
    looped: list = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        PackedParams.encode([{"a": looped}])


@pytest.mark.parametrize("text", ['{"i":1} x', "[1]", "", "{", '"i"'])
def test_decode_params_refuses_what_is_not_one_object(text):
    with pytest.raises(ValueError):
        decode_params(text)


def test_fresh_params_are_taken_once_like_a_dict():
    fresh = FreshParams(PackedParams.encode([{"i": 0}, {"i": 1}]))
    fresh[7] = '{"i":7}'  # as recovery sets one
    assert fresh.pop(1) == '{"i":1}'
    assert fresh.pop(7) == '{"i":7}'
    for taken in (1, 7, 2, -1):
        with pytest.raises(KeyError):
            fresh.pop(taken)
    assert fresh.pop(0) == '{"i":0}'


def test_first_attempt_keys_are_the_reservation_keys():
    keys = first_attempt_keys("b1", 5)
    expected = [reservation_key("b1", idx, 1) for idx in range(5)]
    assert list(keys) == expected and len(keys) == 5
    assert [keys[i] for i in range(5)] == expected and keys[-1] == expected[-1]
    assert list(keys[:3]) == expected[:3]  # the keys of the jobs an account covers
    assert list(keys[1:4]) == expected[1:4]
    assert list(itertools.islice(keys, 2)) == expected[:2]
    with pytest.raises(IndexError):
        keys[5]


async def test_a_cancel_while_a_bag_is_handed_over_is_not_lost(tmp_path):
    """A cancel that comes after the bag is written but before the scheduler has it
    (its reservations still being opened) cancels it: no job of it starts, every
    job ends cancelled and every reservation is released."""
    chunk = admission_module.OPEN_KEYS_CHUNK
    n = 2 * chunk + 3
    cfg = config()
    clock = SimClock(0.0)
    scheduler = await world(tmp_path, clock, 1, cfg)
    bag_id = "b0000000001"
    cancelled = asyncio.Event()

    async def cancel_midway() -> None:
        while not 0 < len(scheduler.accounts.ledger.open) < n:
            await asyncio.sleep(0)
        assert await scheduler.store.request_cancel(bag_id, clock.now())
        scheduler.cancel_requested(bag_id)
        cancelled.set()

    canceller = asyncio.create_task(cancel_midway())
    await admit_bag(scheduler, cfg, n, bag_id)
    await canceller
    assert cancelled.is_set()
    passes = 0
    while bag_id in scheduler.world.bags or scheduler.has_inputs():
        await scheduler.tick()
        assert not scheduler.world.attempts
        passes += 1
        assert passes < 1000, "the bag was never cancelled"
    await scheduler.store.close()
    assert rows(tmp_path, "SELECT state FROM bags") == [("cancelled",)]
    assert rows(tmp_path, "SELECT state, count(*) FROM jobs GROUP BY state") == [("cancelled", n)]
    assert rows(tmp_path, "SELECT count(*) FROM ledger_open") == [(0,)]
    assert scheduler.accounts.view("a")["reserved_cpu_h"] == pytest.approx(0.0, abs=1e-6)


async def test_a_big_bag_held_for_credit_costs_the_collector_nothing_per_job(tmp_path):
    """A 100,000-job bag past its account's credit (on_insufficient_balance = "hold") is
    held as a range, in the bag and in the account's queue (before: a dict and a deque of
    100,000 (bag, index) tuples built on the loop, ~0.5 s for a million); held jobs still
    run in order as credit comes, and a cancel drops them."""
    n = 100_000
    cfg = config(**{"ledger.new_accounts": "credit", "ledger.new_account_cpu_h": 12.0})
    scheduler = await world(tmp_path, SimClock(0.0), 1, cfg)
    spec = bag(n, on_insufficient_balance="hold")
    await admit(
        spec,
        store=scheduler.store,
        scheduler=scheduler,
        catalog=cfg.catalog(),
        bag_id="b0000000001",
        now=scheduler.clock.now(),
        max_jobs=n,
    )
    await scheduler.tick()
    (run,) = scheduler.world.bags.values()
    admitted = len(run.queue) + len(scheduler.world.attempts)
    assert admitted == 3 and len(run.held) == n - admitted  # 12 CPU-h, 4 a job
    assert scheduler.held_jobs() == n - admitted
    assert list(itertools.islice(run.held, 3)) == [admitted, admitted + 1, admitted + 2]
    (queue,) = scheduler.accounts.held.values()
    assert len(queue) == n - admitted and queue[0] == ("b0000000001", admitted)
    gc.collect()
    open_reservations = scheduler.accounts.ledger.open
    assert walked_containers(n // 2, besides=(open_reservations,)) == []
    scheduler.cancel_requested("b0000000001")
    for _ in range(n // 400):
        await scheduler.tick()
        if not scheduler.world.bags:
            break
    assert not scheduler.world.bags  # every held job cancelled, a chunk a pass
    await scheduler.tick()
    assert len(queue) == 0  # the account's held run dropped with its bag
    await scheduler.store.close()


HELD_OPS = st.lists(
    st.tuples(st.sampled_from(["del", "set", "contains"]), st.integers(0, 25)), max_size=60
)


@given(st.integers(0, 10), st.integers(0, 20), HELD_OPS)
def test_held_jobs_are_an_ordered_set_of_their_range(start, stop, ops):
    held, model = HeldJobs(start, stop), dict.fromkeys(range(start, stop))
    for op, idx in ops:
        if op == "del":
            if idx in model:
                del held[idx], model[idx]
            else:
                with pytest.raises(KeyError):
                    del held[idx]
        elif op == "set":
            held[idx] = None
            model.setdefault(idx, None)
        assert (idx in held) == (idx in model)
        assert len(held) == len(model) and bool(held) == bool(model)
        assert sorted(held) == sorted(model) and len(list(held)) == len(model)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "appendleft", "popleft", "range"]),
            st.sampled_from(["a", "b"]),
            st.integers(0, 6),
        ),
        max_size=40,
    )
)
def test_held_queue_is_a_deque_of_bag_index_pairs(ops):
    queue, model = HeldQueue(), deque()
    for op, bag_id, idx in ops:
        if op == "popleft":
            if model:
                assert queue[0] == model[0]
                assert queue.popleft() == model.popleft()
            else:
                with pytest.raises(IndexError):
                    queue.popleft()
        elif op == "range":
            queue.extend_range(bag_id, idx, idx + 3)
            model.extend((bag_id, i) for i in range(idx, idx + 3))
        else:
            getattr(queue, op)((bag_id, idx))
            getattr(model, op)((bag_id, idx))
        assert len(queue) == len(model) and bool(queue) == bool(model)
        assert list(queue) == list(model)
