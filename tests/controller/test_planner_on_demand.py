"""The pure planner's on-demand slots (docs/design.md#deadlines-in-the-daemon): launches
split between markets, on-demand VMs only for bags that want them, spot withheld when
a bag does not use it."""

from __future__ import annotations

import dataclasses

from controller.planner import CatalogType, DemandGroup, Launch, Place, VmView, plan
from drivers.base import VmState
from policies.packing import Shape
from tests.controller.test_planner import snap

# Cheapest per slot on spot: small ($0.01); on-demand: big ($0.30/8 < $0.08/2).
SMALL = CatalogType("small", "z1", Shape(2, 0, 4.0), 0.02, 0.08)
BIG = CatalogType("big", "z1", Shape(8, 0, 32.0), 0.12, 0.30)
ONE = Shape(1, 0, 1.0)


def idle_vm(vm_id: str, *, spot: bool) -> VmView:
    capacity = SMALL.capacity
    return VmView(vm_id, "small", "z1", VmState.RUNNING, capacity, capacity, 0, 900.0, spot=spot)


def full_spot_vm(vm_id: str, ahead: Shape | None = None) -> VmView:
    """A running spot VM with two attempts and no room (room in its executor's queue:
    `ahead`)."""
    no_room = Shape(0, 0, 0.0)
    return VmView(
        vm_id, "small", "z1", VmState.RUNNING, SMALL.capacity, no_room, 2, None, ahead=ahead
    )


def test_missing_on_demand_slots_launch_the_on_demand_vms_cheapest_for_them():
    group = DemandGroup("b1", ONE, 12, on_demand_slots=3, on_demand_running=1)
    decision = plan(snap([group], catalog=(SMALL, BIG)))
    # Two slots are missing: one small on-demand VM ($0.08/h) holds them for less than a
    # big one ($0.30/h, cheaper per slot); the other 10 jobs go to small spot VMs.
    assert decision.launches == [
        Launch("small", 1, "b1", spot=False),
        Launch("small", 5, "b1"),
    ]
    # Eight missing slots: one big VM ($0.30/h) beats four small ones ($0.32/h).
    group = DemandGroup("b1", ONE, 12, on_demand_slots=8)
    decision = plan(snap([group], catalog=(SMALL, BIG)))
    assert decision.launches == [
        Launch("big", 1, "b1", spot=False),
        Launch("small", 2, "b1"),
    ]


def test_a_bag_that_does_not_use_spot_waits_for_on_demand_slots_only():
    group = DemandGroup("b1", ONE, 6, on_demand_slots=2, use_spot=False)
    spot_vm = idle_vm("vm-spot", spot=True)
    decision = plan(snap([group], [spot_vm], catalog=(SMALL, BIG)))
    assert decision.places == []  # not on the idle spot VM
    assert decision.launches == [Launch("small", 1, "b1", spot=False)]


def test_on_demand_vms_take_only_jobs_of_bags_that_want_on_demand_slots():
    on_demand_vm = idle_vm("vm-od", spot=False)
    spot_only = DemandGroup("b1", ONE, 2)
    decision = plan(snap([spot_only], [on_demand_vm], catalog=(SMALL, BIG)))
    assert decision.places == []
    assert decision.launches == [Launch("small", 1, "b1")]
    wanting = DemandGroup("b2", ONE, 2, on_demand_slots=2)
    decision = plan(snap([wanting], [on_demand_vm], catalog=(SMALL, BIG)))
    assert decision.places == [Place("vm-od", "b2", 2)]
    assert decision.launches == []


def test_jobs_for_missing_on_demand_slots_are_not_put_on_idle_spot_vms():
    spot_vm = idle_vm("vm-spot", spot=True)
    group = DemandGroup("b1", ONE, 3, on_demand_slots=2)
    decision = plan(snap([group], [spot_vm], catalog=(SMALL, BIG)))
    # One job on the spot VM; two kept for the on-demand slots and launched for.
    assert decision.places == [Place("vm-spot", "b1", 1)]
    assert decision.launches == [Launch("small", 1, "b1", spot=False)]


def test_spot_vms_take_no_more_attempts_than_the_slots_left_to_spot():
    """The policy turned all but one of the bag's slots on-demand: the idle spot VMs take
    one job (the slot left to spot), the rest wait for on-demand VMs."""
    spot_vms = [idle_vm(f"vm-spot-{i}", spot=True) for i in range(3)]
    group = DemandGroup("b1", ONE, 6, on_demand_slots=5, spot_slots_left=1)
    decision = plan(snap([group], spot_vms, catalog=(SMALL, BIG), max_vms=10))
    assert sum(p.count for p in decision.places) == 1
    # Five on-demand slots: three small VMs ($0.24/h) beat a big one ($0.30/h).
    assert decision.launches == [Launch("small", 3, "b1", spot=False)]
    # No slot left to spot: none placed there, and no spot VM launched either.
    group = DemandGroup("b1", ONE, 6, on_demand_slots=5, spot_slots_left=0)
    decision = plan(snap([group], [], catalog=(SMALL, BIG), max_vms=10))
    assert decision.launches == [Launch("small", 3, "b1", spot=False)]


def test_an_idle_spot_vm_makes_room_for_the_on_demand_vm_max_vms_blocks():
    """max_vms is reached with the bag's spot VMs; one frees while its slots went
    on-demand: it is released (its room is the on-demand VM's) instead of idling as a
    hot spare while the job waits; the next pass launches the on-demand VM."""
    spot_vm = idle_vm("vm-spot", spot=True)
    busy = [full_spot_vm(f"vm-busy-{i}") for i in range(3)]
    group = DemandGroup("b1", ONE, 1, on_demand_slots=8, spot_slots_left=0)
    decision = plan(
        snap([group], [spot_vm, *busy], catalog=(SMALL, BIG), max_vms=4, hot_spare_s=3600.0)
    )
    assert decision.places == [] and decision.launches == []
    assert [t.vm_id for t in decision.terminations] == ["vm-spot"]
    assert "max_vms" in decision.terminations[0].reason
    decision = plan(snap([group], busy, catalog=(SMALL, BIG), max_vms=4))
    assert decision.launches == [Launch("small", 1, "b1", spot=False)]


def test_an_idle_vm_is_kept_while_the_jobs_waiting_launch_nothing():
    """A bag that waits (spot not worth its price, no on-demand slot) launches nothing:
    max_vms is not what stops it, and the idle spot VM it may use later is kept."""
    spot_vm = idle_vm("vm-spot", spot=True)
    group = DemandGroup("b1", ONE, 4, use_spot=False)
    decision = plan(
        snap(
            [group],
            [spot_vm],
            catalog=(SMALL, BIG),
            max_vms=1,
            hot_spare_s=0.0,
            idle_timeout_s=600.0,
        )
    )
    assert decision.terminations == [] and decision.launches == []


def test_a_spot_back_off_leaves_on_demand_launches_of_the_type_alone():
    """Spot launches of `small` failed (no spot capacity, or its price above the bid):
    the bag's on-demand slots still get small on-demand VMs; only spot waits."""
    group = DemandGroup("b1", ONE, 4, on_demand_slots=2)
    snapshot = snap([group], catalog=(SMALL,))
    snapshot = dataclasses.replace(snapshot, blocked_until={"small": 2000.0})
    decision = plan(snapshot)
    assert decision.launches == [Launch("small", 1, "b1", spot=False)]
    assert decision.next_wake_at == 2000.0  # spot is tried again then
    snapshot = dataclasses.replace(
        snapshot, blocked_until={}, on_demand_blocked_until={"small": 2000.0}
    )
    assert plan(snapshot).launches == [Launch("small", 1, "b1")]


def test_jobs_queue_ahead_on_spot_vms_only_within_the_slots_left_to_spot():
    """An executor that queues attempts ahead (Slurm, local): full spot VMs with room in
    their queues take at most the slots the bag leaves to spot (here one, which the spot
    VM launched for it takes); the others wait for the on-demand VMs launched for them."""
    full = [full_spot_vm(f"vm-spot-{i}", ahead=SMALL.capacity) for i in range(3)]
    group = DemandGroup("b1", ONE, 6, on_demand_slots=4, spot_slots_left=1)
    decision = plan(snap([group], full, catalog=(SMALL, BIG), max_vms=10))
    assert decision.places == []  # without the cap: 6 queued on the spot VMs
    assert decision.launches == [
        Launch("small", 2, "b1", spot=False),
        Launch("small", 1, "b1"),
    ]
    # max_vms leaves no room for a spot VM: the two slots left to spot queue on them.
    group = group._replace(spot_slots_left=2)
    decision = plan(snap([group], full, catalog=(SMALL, BIG), max_vms=5))
    assert decision.launches == [Launch("small", 2, "b1", spot=False)]
    assert sum(p.count for p in decision.places) == 2
    # Room on spot for all six: still only the two its on-demand VMs are not launched
    # for queue on spot VMs (the other four wait for those VMs).
    group = group._replace(spot_slots_left=6)
    decision = plan(snap([group], full, catalog=(SMALL, BIG), max_vms=5))
    assert decision.launches == [Launch("small", 2, "b1", spot=False)]
    assert sum(p.count for p in decision.places) == 2
