"""The deadline policy (docs/design.md#deadlines): completion-time distributions on
spot against the checkpoint DP and Monte Carlo, the decision's properties (slack never
escalates, a deadline spot cannot keep does, escalation grows as slack shrinks and
falls back when it returns), Uniform Progress's four rules on hand-made cases, and the
simulator's conservation of jobs, work and money."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from policies import uniform_progress as up
from policies.checkpoint import CheckpointTable, build_table, simulate_makespan
from policies.completion_times import CompletionTimes, build_completion_times
from policies.deadline import (
    DeadlineInputs,
    _last_round_fits,
    deadline_checkpoint_interval_h,
    decide,
    list_schedule_ends_h,
    list_schedule_h,
    meet_probabilities,
    spot_line_on_demand,
)
from policies.deadline_sim import (
    STRATEGIES,
    BagRun,
    Market,
    all_on_demand_makespan_h,
    simulate,
)
from policies.preemption import Bathtub

MODEL = Bathtub(A=0.2476, tau1=1.127, tau2=52.96, b=0.001, L=24.0)  # the shipped pooled fit
STEP_H = 2 / 60
LAUNCH_H = 4 / 60


@functools.cache
def plan() -> tuple[CheckpointTable, CompletionTimes]:
    table = build_table(MODEL, 2.0, STEP_H, restart_h=LAUNCH_H, step_h=STEP_H)
    return table, build_completion_times(MODEL, table)


# --- completion times ------------------------------------------------------------------


@pytest.mark.parametrize("work_h", [0.5, 1.0, 2.0])
def test_fresh_mean_is_the_dp_expectation(work_h: float) -> None:
    """The distribution's mean is the DP's M(J, 0) (a failure is placed at the end of
    its grid step: at most a step late per failure)."""
    table, times = plan()
    J = round(work_h / STEP_H)
    mean, var = times.fresh_moments(np.array([work_h]))
    assert float(mean[0]) == pytest.approx(float(table.makespan[J, 0]), rel=0.01)
    assert float(mean[0]) >= float(table.makespan[J, 0]) - 1e-9
    assert var[0] > 0
    assert times.fresh_cdf[J, -1] == pytest.approx(1.0, abs=1e-6)
    assert np.all(np.diff(times.fresh_cdf[J]) >= -1e-12)


@pytest.mark.parametrize("age_h", [3.0, 12.0, 23.0])
def test_aged_mean_is_the_dp_expectation(age_h: float) -> None:
    table, times = plan()
    mean, _ = times.aged_moments(np.array([1.0]), np.array([age_h]))
    J, a = round(1.0 / STEP_H), round(age_h / STEP_H)
    assert float(mean[0]) == pytest.approx(float(table.makespan[J, a]), rel=0.02)


def test_fresh_mean_agrees_with_monte_carlo() -> None:
    table, times = plan()
    mean, _ = times.fresh_moments(np.array([2.0]))
    mc, se = simulate_makespan(
        MODEL,
        table.schedule(2.0, 0.0).intervals_h,
        table.delta_steps * STEP_H,
        np.random.default_rng(5),
        restart_h=LAUNCH_H,
        runs=4000,
        replan=table,
    )
    assert abs(float(mean[0]) - mc) <= 4 * se + STEP_H * 0.2


def test_a_vm_at_its_deadline_restarts_the_job() -> None:
    """At age L the VM is gone: the job takes a launch plus a fresh run (not never)."""
    _, times = plan()
    mean, _ = times.aged_moments(np.array([1.0]), np.array([24.0]))
    fresh, _ = times.fresh_moments(np.array([1.0]))
    assert float(mean[0]) == pytest.approx(float(fresh[0]) + LAUNCH_H, abs=STEP_H)


@pytest.mark.parametrize("work_h, age_h", [(1.0, 0.0), (2.0, 0.0), (1.0, 6.0), (2.0, 23.0)])
def test_worst_time_with_an_on_demand_retry_bounds_every_draw(work_h: float, age_h: float) -> None:
    """A job on spot whose retry after its first preemption goes on-demand never
    takes longer than `worst_h`: 4,000 lifetimes through the DP's checkpoint plan."""
    table, times = plan()
    worst = float(times.worst_h(np.array([work_h]), np.array([age_h]))[0])
    schedule = table.schedule(work_h, age_h).intervals_h
    delta = table.delta_steps * STEP_H
    rng = np.random.default_rng(3)
    lifetimes = MODEL.sample_h(rng, 20_000)
    alive = lifetimes[lifetimes > age_h][:4000] - age_h  # conditioned on being alive now
    longest = 0.0
    for left_of_life in alive:
        at, saved = 0.0, 0.0
        for k, interval in enumerate(schedule):
            end = at + interval + (delta if k < len(schedule) - 1 else 0.0)
            if end > left_of_life:  # preempted: the rest on an on-demand VM
                at = left_of_life + LAUNCH_H + (work_h - saved)
                break
            at, saved = end, saved + interval
        longest = max(longest, at)
    assert longest <= worst + STEP_H
    assert worst <= 2 * work_h + LAUNCH_H + 0.5  # and not absurdly above the worst case
    assert worst >= work_h


# --- the decision --------------------------------------------------------------------


def bag(seed: int, jobs: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.round(rng.uniform(0.5, 2.0, jobs) / STEP_H) * STEP_H


def inputs_for(works: np.ndarray, slots: int, deadline_h: float, **extra) -> DeadlineInputs:
    fields = dict(
        spot_price_per_hour=0.3,
        on_demand_price_per_hour=1.0,
        on_demand_launch_h=LAUNCH_H,
        confidence=0.99,
    )
    fields.update(extra)
    return DeadlineInputs(
        now_h=0.0, deadline_h=deadline_h, slots=slots, queued_work_h=works, **fields
    )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), jobs=st.integers(5, 200), slots=st.integers(1, 40))
def test_ample_slack_never_escalates(seed: int, jobs: int, slots: int) -> None:
    works = bag(seed, jobs)
    makespan = all_on_demand_makespan_h(works, slots, LAUNCH_H)
    decision = decide(inputs_for(works, slots, 3.0 * makespan + 4.0), plan()[1])
    assert decision.on_demand_slots == 0
    assert not decision.at_risk
    assert decision.launch_spot
    assert decision.p_meet >= 0.99


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), jobs=st.integers(20, 200), slots=st.integers(2, 40))
def test_a_deadline_spot_alone_cannot_keep_escalates(seed: int, jobs: int, slots: int) -> None:
    """With the deadline at the all-on-demand makespan, spot (slower in expectation)
    cannot keep it: some slots go on-demand, and the projection agrees. (With fewer
    jobs than slots, one round, the 0.2 h beyond the makespan can absorb a preemption
    of the one or two longest jobs: spot alone may keep it, 0.994 for 20 jobs on 31.)"""
    assume(jobs >= 2 * slots)
    works = bag(seed, jobs)
    makespan = all_on_demand_makespan_h(works, slots, LAUNCH_H)
    decision = decide(inputs_for(works, slots, makespan + 0.2), plan()[1])
    assert decision.on_demand_slots > 0
    spot_only = meet_probabilities(inputs_for(works, slots, makespan + 0.2), plan()[1])[0]
    assert spot_only < 0.99


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), jobs=st.integers(20, 150), slots=st.integers(2, 30))
def test_escalation_grows_as_slack_shrinks(seed: int, jobs: int, slots: int) -> None:
    works = bag(seed, jobs)
    makespan = all_on_demand_makespan_h(works, slots, LAUNCH_H)
    counts = [
        decide(inputs_for(works, slots, f * makespan), plan()[1], project=False).on_demand_slots
        for f in (3.0, 1.5, 1.2, 1.1, 1.05, 1.0, 0.9)
    ]
    assert counts == sorted(counts)
    assert counts[-1] == slots  # below the on-demand makespan: at risk, all of them


def test_returns_to_spot_when_slack_returns() -> None:
    """On-demand slots escalated when slack was short take no new attempts once it is
    back: the decision keeps only the on-demand attempts still running."""
    _, times = plan()
    works = bag(3, 120)
    running = np.full(6, 0.5)  # six on-demand attempts, half an hour left each
    tight = decide(inputs_for(works, 10, 12.0, on_demand_left_h=running), times, project=False)
    assert tight.on_demand_slots > 6  # short of slack: free slots go on-demand too
    loose = decide(inputs_for(works, 10, 60.0, on_demand_left_h=running), times, project=False)
    assert loose.on_demand_slots == 6  # an on-demand slot that frees goes back to spot


def test_waits_for_spot_with_slack_and_not_past_the_latest_switch() -> None:
    _, times = plan()
    works = bag(4, 60)
    makespan = all_on_demand_makespan_h(works, 10, LAUNCH_H)
    slack = decide(inputs_for(works, 10, 3 * makespan, spot_outage_h=2.0), times, project=False)
    assert not slack.launch_spot and slack.on_demand_slots == 0  # wait for spot
    late = decide(inputs_for(works, 10, makespan + 0.3, spot_outage_h=2.0), times, project=False)
    assert not late.launch_spot and late.on_demand_slots == 10


def test_an_outage_with_little_slack_runs_on_demand_instead_of_idling() -> None:
    """Spot unavailable, a deadline spot could keep only without losing time: the free
    slots do not wait (an idle hour is lost for good) but neither do they all go
    on-demand; with the same outage and ample slack, they wait."""
    _, times = plan()
    works = bag(12, 200)
    makespan = all_on_demand_makespan_h(works, 20, LAUNCH_H)
    spot_mean = float(times.fresh_moments(works)[0].sum()) / 20
    deadline = spot_mean + 0.6  # spot alone fits, but not after an hour's outage
    tight = decide(inputs_for(works, 20, deadline, spot_outage_h=1.0), times, project=False)
    assert not tight.launch_spot and 0 < tight.on_demand_slots < 20
    assert makespan < deadline
    loose = decide(inputs_for(works, 20, 3 * makespan, spot_outage_h=1.0), times, project=False)
    assert not loose.launch_spot and loose.on_demand_slots == 0


def test_dear_spot_is_launched_rather_than_idling_when_slack_is_short() -> None:
    """Spot at a price not worth paying but at or below the bid: with slack, wait for a
    better price; without, launch it (idling would spend the slack)."""
    _, times = plan()
    works = bag(13, 200)
    spot_mean = float(times.fresh_moments(works)[0].sum()) / 20
    dear = dict(spot_price_per_hour=0.99, spot_outage_h=1.0, spot_available=True)
    tight = decide(inputs_for(works, 20, spot_mean + 0.6, **dear), times, project=False)
    assert tight.launch_spot
    loose = decide(inputs_for(works, 20, 3 * spot_mean, **dear), times, project=False)
    assert not loose.launch_spot and loose.on_demand_slots == 0


def test_dear_spot_is_launched_while_waiting_would_leave_spot_no_room_for_its_spread():
    """Spot at the bid (no outage, not worth its price): the bag may wait one more look
    only if spot alone would then still finish at the confidence, not merely in
    expectation: at 1.05 × spot's expected pace the expectation line says wait, but
    after waiting spot's spread could not be met without on-demand, dearer."""
    _, times = plan()
    works = bag(13, 200)
    spot_mean = float(times.fresh_moments(works)[0].sum()) / 20
    at_bid = dict(spot_price_per_hour=0.99, spot_available=True)
    for factor in (1.02, 1.05, 1.1):
        inputs = inputs_for(works, 20, factor * spot_mean, **at_bid)
        assert spot_line_on_demand(inputs, times) == 0  # spot would finish in expectation
        decision = decide(inputs, times, project=False)
        assert decision.launch_spot and decision.on_demand_slots == 0
    for factor in (1.2, 1.5):
        decision = decide(inputs_for(works, 20, factor * spot_mean, **at_bid), times)
        assert not decision.launch_spot and decision.on_demand_slots == 0


def test_the_last_round_lets_a_late_spot_attempt_use_its_slots_slack() -> None:
    """The last round's check (b): two jobs left (1 h and 6 min) for three slots, one an
    on-demand VM busy past the moment the 1-h job must start, two spot attempts (3 min
    and 48 min left). Counting slots free by limit − w_max, one a job, needs both spot
    attempts done by then, and the 48-min one cannot be: at risk. List scheduled, the
    short job goes on the slot the 48-min attempt frees, with 35 min to spare for it."""
    _, times = plan()
    inputs = inputs_for(np.zeros(0), 3, 1.6, confidence=0.95)
    free_at = np.array([1.05, 0.0, 0.0])  # on-demand, then the two spot slots
    spot_slot = np.array([False, True, True])
    work = np.array([0.05, 0.8])
    spot = (work, np.array([6.0, 6.0]), np.zeros(2), np.zeros(2))  # work, age, launch, unsaved
    left = np.array([1.0, 0.1])
    assert _last_round_fits(inputs, times, free_at, spot_slot, spot, left, 1.6)
    # With no slack for it (the limit 0.35 h sooner), it does not fit.
    assert not _last_round_fits(inputs, times, free_at, spot_slot, spot, left, 1.25)


def test_an_outage_is_waited_out_only_while_spot_after_it_meets_the_confidence() -> None:
    """No spot for an expected hour: at 1.1 × spot's expected pace spot would still
    finish in expectation after it (the expectation line says wait), but not at the
    confidence: some slots go on-demand now. With more slack the bag waits."""
    _, times = plan()
    works = bag(13, 200)
    spot_mean = float(times.fresh_moments(works)[0].sum()) / 20
    outage = dict(spot_outage_h=1.0, spot_available=False)
    tight = inputs_for(works, 20, 1.1 * spot_mean, **outage)
    assert spot_line_on_demand(tight, times) == 0
    decision = decide(tight, times, project=False)
    assert 0 < decision.on_demand_slots < 20 and not decision.launch_spot
    loose = decide(inputs_for(works, 20, 1.3 * spot_mean, **outage), times, project=False)
    assert loose.on_demand_slots == 0 and not loose.launch_spot


def test_spot_too_dear_is_not_launched() -> None:
    _, times = plan()
    works = bag(5, 30)
    dear = decide(inputs_for(works, 5, 100.0, spot_price_per_hour=0.99), times)
    assert not dear.launch_spot


def test_finish_quantiles_are_ordered_and_at_risk_when_impossible() -> None:
    _, times = plan()
    works = bag(6, 80)
    makespan = all_on_demand_makespan_h(works, 8, LAUNCH_H)
    decision = decide(inputs_for(works, 8, 2 * makespan), times, quantiles=(0.5, 0.9, 0.99))
    finish = [h for _, h in decision.finish_quantiles_h]
    assert finish == sorted(finish) and finish[0] > makespan * 0.9
    assert decide(inputs_for(works, 8, 0.5 * makespan), times).at_risk


def test_the_last_round_holds_the_confidence_for_all_its_attempts_together() -> None:
    """Twenty one-hour jobs, one per slot: a deadline that leaves each spot attempt
    exactly its own 0.99 quantile leaves all twenty only 0.99^20 ≈ 0.82 together, so
    slots go on-demand; with time for a failed attempt's retry on on-demand (its path
    and its work again), none do."""
    _, times = plan()
    works = np.full(20, 1.0)
    lag = 10 / 60
    own = LAUNCH_H + times.fresh_quantile_h(1.0, 0.99) + LAUNCH_H + lag
    assert decide(inputs_for(works, 20, own), times, project=False).on_demand_slots > 0
    retry = 2 * 1.1 * 1.0 + 2 * LAUNCH_H + lag + 0.1
    assert decide(inputs_for(works, 20, retry), times, project=False).on_demand_slots == 0


@settings(max_examples=600, deadline=None)
@given(
    work_h=st.floats(0.05, 6.0),
    hours_h=st.floats(0.0, 14.0),
    checkpoint_h=st.floats(1 / 120, 0.25),
    restart_h=st.floats(0.0, 0.3),
    picks=st.lists(
        st.one_of(st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=400,
    ),
)
# A checkpoint just short of the end where running to the end is allowed: its segment
# (i + δ) must still fit the slack (a bound without s − δ let it end 1.3 s late).
@example(
    work_h=3.625,
    hours_h=6.0,
    checkpoint_h=0.25,
    restart_h=0.0,
    picks=[0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.022322111021323865, 1.0, 1.0],
)
def test_checkpoint_intervals_within_the_deadlines_bounds_keep_the_worst_case_in_time(
    work_h: float, hours_h: float, checkpoint_h: float, restart_h: float, picks: list[float]
) -> None:
    """`deadline_checkpoint_interval_h`: an attempt that, at each checkpoint, takes any
    interval between the bounds given for its work and hours left then (`picks` says
    where; 1.0 runs to the end where that is allowed) ends within the hours whatever
    befalls it: its VM dying just before each checkpoint is written, or just before
    the end, and its retry redoing the work since the last one, and the rest, after a
    restart. Where there are no bounds, no plan could: not even the one that takes the
    longest interval its slack allows at every checkpoint (s − δ, s − 2δ, ...), for any
    number of checkpoints."""
    shortest, longest, _ = (
        float(x) for x in deadline_checkpoint_interval_h(work_h, hours_h, checkpoint_h, restart_h)
    )
    slack = hours_h - work_h - restart_h
    if math.isnan(shortest):
        assert math.isnan(longest)
        n = np.arange(0, 5000)
        most = np.max((n + 1) * slack - checkpoint_h * n * (n + 3) / 2)
        assert slack <= 0 or work_h > most - 1e-9
        return
    assert longest == pytest.approx(slack - checkpoint_h)
    at, left, worst = 0.0, work_h, work_h
    for pick in [*picks, 1.0] * 50:
        low, high, to_end = (
            float(x)
            for x in deadline_checkpoint_interval_h(left, hours_h - at, checkpoint_h, restart_h)
        )
        assert not math.isnan(low), "a plan within the bounds ran out of them"
        interval = low + pick * (high - low)
        if low > high or (to_end and pick == 1.0) or interval >= left - 1e-12:
            assert to_end, "the bounds left only the end, and it does not fit"
            worst = max(worst, at + left + restart_h + left)  # all lost just before the end
            at, left = at + left, 0.0
            break
        worst = max(worst, at + interval + checkpoint_h + restart_h + left)
        at, left = at + interval + checkpoint_h, left - interval
    assert left == 0.0
    assert worst <= hours_h + 1e-9
    assert at <= hours_h + 1e-9


def test_a_plan_at_its_shortest_bound_keeps_its_bounds_on_an_epoch_clock() -> None:
    """An attempt that takes the shortest interval at every checkpoint leaves each later
    check an equality (its work exactly what its slack allows). The scheduler computes
    the hours from epoch seconds, whose rounding is ~1e-10 h a step: the bounds must
    survive it to the end (with a relative tolerance of 1e-12 they vanished mid-tail,
    and the DP's uncapped plan stood)."""
    # (A case a review found: work on the edge of what its slack allows, from the start.)
    delta, restart = 2.8769570381693383e-05, 0.5099656357073844
    switch_s = 1_800_000_000.0 + 4.232891339393145 * 3600.0
    at_s, left = 1_800_000_000.0, 3.708304078856172
    steps = 0
    while left > 0:
        hours_h = (switch_s - at_s) / 3600.0
        low, high, to_end = (
            float(x) for x in deadline_checkpoint_interval_h(left, hours_h, delta, restart)
        )
        assert not math.isnan(low), f"bounds lost after {steps} checkpoints"
        if low > high or low >= left:
            assert to_end
            break
        at_s += (low + delta) * 3600.0
        left -= low
        steps += 1
    assert steps > 40


def test_the_last_round_counts_on_the_deadlines_checkpoint_cap() -> None:
    """Twenty one-hour jobs, one per slot, the deadline at each spot attempt's own 0.99
    quantile: planned with the DP's checkpoints, a VM dying late leaves its retry no
    time, and 19 slots go on-demand. With the scheduler capping each attempt's interval
    by the deadline (`checkpoint_h`: 2-min checkpoints), the worst case (lose an
    interval, a launch, the whole hour again) still ends in time: none do."""
    _, times = plan()
    works = np.full(20, 1.0)
    lag = 10 / 60
    deadline = LAUNCH_H + times.fresh_quantile_h(1.0, 0.99) + LAUNCH_H + lag
    uncapped = decide(inputs_for(works, 20, deadline), times, project=False)
    assert uncapped.on_demand_slots >= 15
    capped = decide(inputs_for(works, 20, deadline, checkpoint_h=STEP_H), times, project=False)
    assert capped.on_demand_slots == 0 and capped.launch_spot
    # Too little slack for any interval: the cap cannot help, and slots go on-demand.
    short = 2 * LAUNCH_H + 1.2 + lag
    assert (
        decide(
            inputs_for(works, 20, short, checkpoint_h=STEP_H), times, project=False
        ).on_demand_slots
        > 0
    )


def test_an_attempt_past_its_checkpoint_bound_is_not_counted_as_bounded() -> None:
    """Twenty running one-hour jobs, each `unsaved` hours past its last checkpoint (so 1 h
    was left there), 0.4 h of slack beyond a retry's worst case from that checkpoint:
    the longest interval the deadline allows is 0.37 h (the slack less a checkpoint).
    An attempt within it (0.2 h unsaved) has its checkpoint due in time and counts its
    worst case as ending by the switch; one past it, 0.45 h > longest + δ = 0.4 h (its
    checkpoint failed, or its timer plans none), may lose all of that and more: it
    counts its own worst case, and the bag is at risk."""
    _, times = plan()
    lag = 10 / 60
    from_mark_h = 2 * LAUNCH_H + 1.0 + lag + 0.4  # the deadline, hours from the checkpoint
    _, longest, _ = deadline_checkpoint_interval_h(
        1.0, from_mark_h - lag - LAUNCH_H, STEP_H, LAUNCH_H
    )
    assert float(longest) == pytest.approx(0.4 - STEP_H)

    def decision(unsaved_h: float):
        inputs = inputs_for(
            np.array([]),
            20,
            from_mark_h - unsaved_h,
            checkpoint_h=STEP_H,
            spot_work_h=np.full(20, 1.0 - unsaved_h),
            spot_age_h=np.full(20, 1.0),
            spot_unsaved_h=np.full(20, unsaved_h),
        )
        return decide(inputs, times, project=False)

    assert not decision(0.2).at_risk
    assert decision(0.45).at_risk


def test_the_policy_finds_bounds_only_where_the_scheduler_does() -> None:
    """The scheduler bounds checkpoints with the on-demand launch as the restart; the
    completion-time tables round theirs to the grid (4 min here, the launch 5). Where
    the launch leaves no plan, the policy must not count the attempt as bounded: it
    decides as if no checkpoint were bounded (with the tables' restart it found a plan,
    trusted bounds the timer never applied, and kept 20 slots on spot)."""
    _, times = plan()
    lag, launch = 10 / 60, 5 / 60
    assert times.restart_h == pytest.approx(LAUNCH_H) and launch > LAUNCH_H
    to_switch_h, unsaved_h = 1.345, 0.1  # from the last checkpoint, 1 h left there
    shortest, _, _ = deadline_checkpoint_interval_h(1.0, to_switch_h, STEP_H, launch)
    assert math.isnan(float(shortest))
    assert not math.isnan(
        float(deadline_checkpoint_interval_h(1.0, to_switch_h, STEP_H, LAUNCH_H)[0])
    )

    def decision(checkpoint_h: float | None):
        inputs = inputs_for(
            np.array([]),
            20,
            to_switch_h + lag + launch - unsaved_h,
            checkpoint_h=checkpoint_h,
            on_demand_launch_h=launch,
            spot_work_h=np.full(20, 1.0 - unsaved_h),
            spot_age_h=np.full(20, 1.0),
            spot_unsaved_h=np.full(20, unsaved_h),
        )
        return decide(inputs, times, project=False)

    bounded, unbounded = decision(STEP_H), decision(None)
    assert unbounded.at_risk
    assert (bounded.on_demand_slots, bounded.at_risk) == (
        unbounded.on_demand_slots,
        unbounded.at_risk,
    )


def test_list_schedule() -> None:
    assert list_schedule_h([3, 3, 2, 2, 2], [0, 0]) == 7  # 3 + 2 + 2 and 3 + 2
    assert list_schedule_h([], [1.0, 2.0]) == 2.0
    assert list_schedule_h([1.0], [5.0, 0.0]) == 5.0
    # Each slot's end, in the slots' order: the job goes to the slot free first.
    assert list(list_schedule_ends_h([1.0], [5.0, 0.0])) == [5.0, 1.0]
    assert list(list_schedule_ends_h([3, 3, 2, 2, 2], [0, 0])) == [7.0, 5.0]
    # In the queue's own order (short ones first) the long job comes last: 1 + 3.
    assert list_schedule_h([1, 1, 1, 3], [0, 0], ordered=True) == 4
    assert list_schedule_h([1, 1, 1, 3], [0, 0]) == 3


def test_work_a_preemption_would_lose_now_is_allowed_for() -> None:
    """Eight attempts on spot with half an hour left, 40 one-hour jobs queued: the
    fallback fits, unless the attempt with 1.5 h of work since its last checkpoint
    dies now (its job back in the queue with that work to redo)."""
    _, times = plan()
    works = np.full(40, 1.0)
    running = dict(spot_work_h=np.full(8, 0.5), spot_age_h=np.full(8, 5.0))
    saved = decide(inputs_for(works, 10, 5.0, **running), times, project=False)
    assert saved.on_demand_slots == 0 and not saved.at_risk
    unsaved = np.concatenate(([1.5], np.zeros(7)))
    exposed = decide(inputs_for(works, 10, 5.0, spot_unsaved_h=unsaved, **running), times)
    assert exposed.on_demand_slots > 0
    slack = decide(inputs_for(works, 10, 6.0, spot_unsaved_h=unsaved, **running), times)
    assert slack.on_demand_slots == 0  # with slack, the loss is absorbed


@pytest.mark.parametrize("deadline_h", [3.0, 6.0, 40.0])
def test_more_attempts_running_than_slots_counts_them_all(deadline_h: float) -> None:
    """A scheduler may run more attempts than the slots it counted (attempts queued ahead
    on an executor, other VM types): 20 on spot and 2 on on-demand with 10 slots, 30
    queued. The policy takes the slots as at least the attempts running, decides, and
    projects (a bag whose pass once failed on a negative array size)."""
    _, times = plan()
    running = dict(
        spot_work_h=np.full(20, 0.5),
        spot_age_h=np.full(20, 2.0),
        spot_unsaved_h=np.full(20, 0.25),
        on_demand_left_h=np.full(2, 0.5),
    )
    decision = decide(inputs_for(np.full(30, 1.0), 10, deadline_h, **running), times)
    assert 0 <= decision.on_demand_slots <= 22
    assert 0.0 <= decision.p_meet <= 1.0
    if deadline_h >= 40.0:  # ample slack: the two on on-demand, no more
        assert decision.on_demand_slots == 2 and not decision.at_risk


# --- Uniform Progress --------------------------------------------------------------------


def state(**changes) -> up.ProgressState:
    base = dict(
        now_h=10.0,
        start_h=0.0,
        deadline_h=100.0,
        total_work_h=50.0,
        progress_h=5.0,
        work_left_h=45.0,
        changeover_h=0.1,
        spot_available=True,
        current=up.Kind.WAIT,
    )
    base.update(changes)
    return up.ProgressState(**base)


def test_uniform_progress_rules() -> None:
    # ep(10) = 50·10/100 = 5.
    assert up.expected_progress_h(50, 0, 100, 10) == 5.0
    # Rule 2: spot whenever available, even behind the line.
    assert up.decide(state(progress_h=1.0)) == (up.Kind.SPOT, False)
    # Rule 1: idle, behind the line, no spot: on-demand.
    assert up.decide(state(progress_h=4.9, spot_available=False)) == (up.Kind.ON_DEMAND, False)
    # Idle, on or ahead of the line, no spot: wait.
    assert up.decide(state(progress_h=5.0, spot_available=False)) == (up.Kind.WAIT, False)
    # Rule 3: on on-demand, stay until cp >= ep(t + 2d) = 50·10.2/100 = 5.1.
    on_demand = dict(current=up.Kind.ON_DEMAND)
    assert up.decide(state(progress_h=5.05, **on_demand)) == (up.Kind.ON_DEMAND, False)
    assert up.decide(state(progress_h=5.1, **on_demand)) == (up.Kind.SPOT, False)
    # ... and back to spot only when there is spot.
    assert up.decide(state(progress_h=6, spot_available=False, **on_demand))[0] == up.Kind.ON_DEMAND
    # Rule 2: on spot, stay there while it lasts.
    assert up.decide(state(progress_h=1.0, current=up.Kind.SPOT)) == (up.Kind.SPOT, False)
    # Rule 4: R(t) = 90 < C(t) + 2d = 89.9 + 0.2: on-demand until the end.
    assert up.decide(state(work_left_h=89.9)) == (up.Kind.ON_DEMAND, True)
    assert up.decide(state(work_left_h=89.7)) == (up.Kind.SPOT, False)
    assert up.decide(state(safety_net=True)) == (up.Kind.ON_DEMAND, True)


def test_uniform_progress_for_a_bag_of_ten_slots() -> None:
    plan = up.plan_bag
    # Rule 2: spot available, new attempts on spot; slots on on-demand VMs leave them
    # once ahead of ep(t + 2d) = 5.1 (rule 3), and keep them while behind it.
    assert plan(state(progress_h=5.1), 10, 3) == up.BagPlan(0, True, False)
    assert plan(state(progress_h=5.05), 10, 3) == up.BagPlan(3, True, False)
    # Rule 1: behind the line, no spot: every slot on-demand.
    assert plan(state(progress_h=4.9, spot_available=False), 10, 3) == up.BagPlan(10, False, False)
    # Ahead, no spot: the new attempts wait; on-demand slots stay (no spot to go to).
    assert plan(state(progress_h=6.0, spot_available=False), 10, 3) == up.BagPlan(3, False, False)
    # Rule 4: every slot on-demand, for good.
    assert plan(state(work_left_h=89.9), 10, 0) == up.BagPlan(10, False, True)
    assert plan(state(safety_net=True, progress_h=40.0), 10, 0) == up.BagPlan(10, False, True)


def test_a_bags_work_left_for_uniform_progress_is_list_scheduling() -> None:
    # C(t) in the daemon (Deadlines._uniform_progress): jobs of 3, 2, 2, 1 h on two
    # slots free at 0.5 h and 0 h, longest first: 0 + 3 = 3 | 0.5 + 2 = 2.5, + 2 = 4.5;
    # 3 + 1 = 4: 4.5 h.
    assert list_schedule_h([2.0, 1.0, 3.0, 2.0], [0.5, 0.0]) == 4.5


# --- the simulator ------------------------------------------------------------------------


def small_market(outage: tuple[float, float] | None = None) -> Market:
    step = 5 / 60
    n = round(200 / step)
    t = np.arange(n) * step
    prices = 0.3 + 0.05 * np.sin(t)  # below the bid (1.0) ...
    if outage is not None:  # ... except in an outage, above it
        prices = np.where((t >= outage[0]) & (t < outage[1]), 1.5, prices)
    return Market(step, prices, 1.0)


def run_for(strategy: str, works: np.ndarray, slots: int, deadline_h: float, market: Market):
    table, times = plan()
    run = BagRun(works, slots, deadline_h, market, MODEL, table, times, strategy, launch_h=LAUNCH_H)
    return simulate(run, np.random.default_rng(11))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_simulation_conserves_jobs_work_and_money(strategy: str) -> None:
    works = bag(7, 40)
    market = small_market(outage=(3.0, 4.0))
    makespan = all_on_demand_makespan_h(works, 5, LAUNCH_H)
    result = run_for(strategy, works, 5, 1.5 * makespan, market)
    assert result.jobs_done == 40
    assert result.work_done_h == pytest.approx(float(works.sum()))
    assert result.cost_usd == pytest.approx(sum(v.cost_usd for v in result.vms))
    for vm in result.vms:
        if vm.kind == "on_demand":
            assert vm.cost_usd == pytest.approx(1.0 * (vm.end_h - vm.start_h))
        else:  # Σ price × time over the grid, by a fine Riemann sum
            t = np.linspace(vm.start_h, vm.end_h, 4001)[:-1]
            dt = (vm.end_h - vm.start_h) / 4000
            steps = np.minimum((t / market.step_h + 1e-9).astype(int), len(market.spot_price) - 1)
            assert vm.cost_usd == pytest.approx(
                float(market.spot_price[steps].sum() * dt), rel=2e-3
            )
    # No VM outlives the bag, and slots never hold two VMs: VM hours fit in K × makespan.
    assert all(vm.end_h <= result.makespan_h + 1e-9 for vm in result.vms)
    assert result.spot_vm_h + result.on_demand_vm_h <= 5 * result.makespan_h + 1e-6
    if strategy == "all_on_demand":
        assert result.makespan_h == pytest.approx(makespan)
        assert result.preemptions == 0 and result.spot_vm_h == 0
    if strategy == "all_spot":
        assert result.on_demand_vm_h == 0


def test_a_bag_spot_cannot_finish_in_time_escalates_and_meets_its_deadline() -> None:
    """Spot unavailable for hours in the middle: all spot misses, the policy escalates
    (on-demand hours) and meets the deadline."""
    works = bag(8, 60)
    makespan = all_on_demand_makespan_h(works, 6, LAUNCH_H)
    market = small_market(outage=(2.0, 2.0 + makespan))
    spot = run_for("all_spot", works, 6, 1.3 * makespan, market)
    ours = run_for("spotbag", works, 6, 1.3 * makespan, market)
    assert not spot.met
    assert ours.met and ours.on_demand_vm_h > 0


def test_a_bag_with_slack_never_escalates_in_the_simulator() -> None:
    works = bag(9, 60)
    makespan = all_on_demand_makespan_h(works, 6, LAUNCH_H)
    ours = run_for("spotbag", works, 6, 3 * makespan, small_market())
    assert ours.met and ours.on_demand_vm_h == 0
    assert math.isfinite(ours.makespan_h)


def test_on_demand_attempts_ending_together_go_back_to_spot_together() -> None:
    """An hour's outage at the start with little slack: the idle slots run one round
    on on-demand (as many as meeting the deadline at the confidence needs: 8 of 10),
    whose attempts all end at the same instant; the decision then keeps no on-demand
    slot, and each of them goes back to spot (the simulator counts the slots freeing
    at that instant as free, not as on-demand attempts still running)."""
    works = np.full(60, 1.0)
    makespan = all_on_demand_makespan_h(works, 10, LAUNCH_H)
    result = run_for("spotbag", works, 10, 1.4 * makespan, small_market(outage=(0.0, 1.0)))
    first = [vm for vm in result.vms if vm.kind == "on_demand" and vm.start_h < 1.0]
    assert 2 <= len(first) <= 10
    assert len({round(vm.end_h, 6) for vm in first}) == 1  # all released together
    assert result.met
