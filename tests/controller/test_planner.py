"""The pure planner: packing, launches, limits, back-off and idle release."""

from __future__ import annotations

from controller.planner import (
    CatalogType,
    DemandGroup,
    Launch,
    Place,
    Snapshot,
    Terminate,
    VmView,
    plan,
    why_unplaceable,
)
from drivers.base import VmState
from policies.packing import Shape

SMALL = CatalogType("small", "z1", Shape(2, 0, 4.0), 0.02)
BIG = CatalogType("big", "z1", Shape(8, 0, 32.0), 0.12)
GPU = CatalogType("gpu", "z2", Shape(8, 1, 60.0), 0.9)
ONE = Shape(1, 0, 1.0)


def vm(
    vm_id,
    *,
    state=VmState.RUNNING,
    capacity=SMALL.capacity,
    free=None,
    jobs=0,
    idle_since=None,
    vm_type="small",
    zone="z1",
):
    return VmView(vm_id, vm_type, zone, state, capacity, free or capacity, jobs, idle_since)


def snap(
    demand=(),
    vms=(),
    *,
    alive=None,
    max_vms=10,
    now=1000.0,
    idle_timeout_s=60.0,
    blocked=None,
    catalog=(SMALL, BIG, GPU),
    hot_spare_s=0.0,
):
    return Snapshot(
        now=now,
        demand=list(demand),
        vms=list(vms),
        catalog=list(catalog),
        alive_vms=len(vms) if alive is None else alive,
        max_vms=max_vms,
        idle_timeout_s=idle_timeout_s,
        hot_spare_s=hot_spare_s,
        blocked_until=blocked or {},
    )


def test_fills_the_fullest_vm_first_and_launches_for_the_rest():
    vms = [vm("a", free=Shape(2, 0, 4.0)), vm("b", free=Shape(1, 0, 3.0), jobs=1)]
    result = plan(snap([DemandGroup("bag1", ONE, 9)], vms))
    assert result.places == [Place("b", "bag1", 1), Place("a", "bag1", 2)]
    # 6 jobs left; small holds 2 per VM at $0.01 per slot, cheaper than big's $0.015.
    assert result.launches == [Launch("small", 3, "bag1")]


def test_pending_vms_count_as_capacity_on_the_way():
    pending = [vm(f"p{i}", state=VmState.PENDING) for i in range(2)]
    result = plan(snap([DemandGroup("bag1", ONE, 5)], pending))
    assert result.places == [] and result.launches == [Launch("small", 1, "bag1")]


def test_max_vms_caps_launches_oldest_bag_first():
    demand = [DemandGroup("old", ONE, 6), DemandGroup("new", ONE, 6)]
    result = plan(snap(demand, [], alive=7, max_vms=10))
    assert result.launches == [Launch("small", 3, "old")]


def test_allowed_types_and_regions_are_respected():
    group = DemandGroup("bag1", ONE, 2, vm_types=("big",))
    result = plan(snap([group], [vm("a")]))
    assert result.places == [] and result.launches == [Launch("big", 1, "bag1")]
    in_region = DemandGroup("bag2", ONE, 1, regions=("z2",))
    assert plan(snap([in_region])).launches == [Launch("gpu", 1, "bag2")]


def test_gpu_vms_are_kept_for_gpu_jobs_while_any_wait():
    gpu_vm = vm("g", capacity=GPU.capacity, vm_type="gpu", zone="z2")
    demand = [DemandGroup("cpu", ONE, 1), DemandGroup("gpu", Shape(1, 1, 8.0), 1)]
    result = plan(snap(demand, [gpu_vm]))
    assert result.places == [Place("g", "gpu", 1)]
    assert result.launches == [Launch("small", 1, "cpu")]
    # Without GPU demand, CPU jobs may use the GPU VM's spare capacity.
    assert plan(snap([DemandGroup("cpu", ONE, 1)], [gpu_vm])).places == [Place("g", "cpu", 1)]


def test_backed_off_types_are_skipped_until_the_back_off_ends():
    result = plan(snap([DemandGroup("bag1", ONE, 2)], blocked={"small": 1500.0}))
    assert result.launches == [Launch("big", 1, "bag1")]
    only_small = plan(
        snap([DemandGroup("bag1", ONE, 2)], blocked={"small": 1500.0}, catalog=(SMALL,))
    )
    assert only_small.launches == [] and only_small.next_wake_at == 1500.0


def test_idle_vms_are_terminated_after_the_timeout():
    vms = [
        vm("old", idle_since=900.0),
        vm("young", idle_since=990.0),
        vm("busy", jobs=1, free=Shape(1, 0, 3.0)),
    ]
    result = plan(snap([], vms, now=1000.0, idle_timeout_s=60.0))
    assert result.terminations == [Terminate("old", "idle for 100 s")]
    assert result.next_wake_at == 1050.0
    # An idle VM that gets work is not terminated.
    assert plan(snap([DemandGroup("b", ONE, 1)], vms[:1])).terminations == []


def test_jobs_no_type_can_hold_are_reported_not_dropped():
    result = plan(snap([DemandGroup("huge", Shape(16, 0, 8.0), 3)]))
    assert result.launches == [] and len(result.unplaceable) == 1
    assert (
        "cpus=16" in result.unplaceable[0].reason
        and "largest allowed is gpu" in result.unplaceable[0].reason
    )
    assert why_unplaceable(ONE, ("nope",), None, [SMALL]).startswith("no VM type is allowed")
    assert why_unplaceable(ONE, None, None, [SMALL]) is None


# --- the reuse policy, hot spares and release (docs/design.md#reuse) ------------------------------

from policies.preemption import Bathtub  # noqa: E402
from policies.reuse import ReuseTable  # noqa: E402

TABLE = ReuseTable.build(Bathtub(A=0.45, tau1=1.0, tau2=0.8, b=24.0, L=24.0), launch_h=0.05)


def old_vm(vm_id, age_h, *, idle_since=900.0):
    """An idle running VM of the given age, under the bathtub model's reuse table."""
    return vm(vm_id, idle_since=idle_since)._replace(age_h=age_h, table=TABLE)


def test_an_old_vm_gets_short_jobs_but_not_long_ones():
    late = old_vm("late", 20.0)
    short = plan(snap([DemandGroup("b", ONE, 1, runtime_h=2.0)], [late]))
    assert short.places == [Place("late", "b", 1)]
    long = plan(snap([DemandGroup("b", ONE, 1, runtime_h=6.0)], [late]))
    assert long.places == [] and long.launches == [Launch("small", 1, "b")]
    # A VM that just booted is never refused, whatever the job.
    booted = old_vm("new", 0.05)
    assert plan(snap([DemandGroup("b", ONE, 1, runtime_h=23.0)], [booted])).places == [
        Place("new", "b", 1)
    ]


def test_a_refused_idle_vm_is_released_when_max_vms_blocks_a_launch():
    late = old_vm("late", 20.0)
    result = plan(snap([DemandGroup("b", ONE, 1, runtime_h=6.0)], [late], max_vms=1))
    assert result.launches == []
    assert result.terminations == [
        Terminate("late", "released: a fresh VM is better for 6.0 h jobs than this one at 20.0 h")
    ]
    # With room for a fresh VM it is not released early (it may serve shorter jobs).
    just_idle = old_vm("late", 20.0, idle_since=990.0)
    assert (
        plan(snap([DemandGroup("b", ONE, 1, runtime_h=6.0)], [just_idle], max_vms=2)).terminations
        == []
    )


def test_stable_idle_vms_are_hot_spares():
    stable, risky = old_vm("stable", 8.0, idle_since=0.0), old_vm("risky", 0.2, idle_since=0.0)
    result = plan(snap([], [stable, risky], now=1000.0, idle_timeout_s=60.0, hot_spare_s=3600.0))
    assert result.terminations == [Terminate("risky", "idle for 1000 s")]
    assert result.next_wake_at == 3600.0
    later = plan(snap([], [stable], now=3600.0, idle_timeout_s=60.0, hot_spare_s=3600.0))
    assert later.terminations == [Terminate("stable", "hot spare idle for 3600 s")]
    # An on-demand VM is never preempted: no spare, ended at the idle timeout.
    on_demand = old_vm("on-demand", 8.0, idle_since=0.0)._replace(spot=False)
    result = plan(snap([], [on_demand], now=1000.0, idle_timeout_s=60.0, hot_spare_s=3600.0))
    assert result.terminations == [Terminate("on-demand", "idle for 1000 s")]
