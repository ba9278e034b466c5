"""Checkpoint schedules when preemptions come with a notice (docs/design.md#checkpoint-notices).

Both clouds warn before they take a spot VM: EC2 two minutes ahead, GCE about 30 s. A
job told at once (SIGUSR1 at the notice) writes a checkpoint of everything it has done
so far; with a lead ℓ at least the checkpoint's cost δ, a noticed preemption loses no
work, only time: from the notice to the moment a fresh VM can take the job, which is
C_n = max(ℓ, R) when the replacement is launched at the notice (the VM dies ℓ after it,
the replacement is ready R after it). Scheduled checkpoints are then needed only
against the preemptions that come without a notice (a share 1 - q of them), so the
optimal schedule checkpoints less.

The model. A VM's lifetime X follows the preemption model (cdf F, first moment G). With
probability q its preemption is announced at X - ℓ (the job's *event* is the notice),
otherwise it is not (the event is X). A fresh VM is one without an event at age 0, so
the event distribution on ages u >= 0 is, with Z = 1 - q·F(ℓ),

    F_u(u) = (1 - q)·F(u) / Z                       unannounced preemptions by age u
    F_n(u) = q·(F(u + ℓ) - F(ℓ)) / Z                 notices by age u
    G_u, G_n                                         their first moments (time of the event)

The recursion (`checkpoint.build_table`'s, with a third outcome). With J steps of
work left on a VM of age t, a first interval of i steps and segment d = i + δ (i for
the last), e = t + d, S_e = 1 - F_u - F_n the event survival, W_k = M(J - k, 0):

    S_e(t)·M(J, t) = min_i  S_e(e)·(d + M(J - i, e))
                          + [G_u + G_n](t..e) - t·[F_u + F_n](t..e)       time to the event
                          + F_u(t..e)·(R + M(J, 0))                        all since t lost
                          + F_n(t..e)·C_n + Σ_{s=1..i} F_n(t+s-1..t+s)·W_{s-1}
                                          + F_n(t+i..e)·W_i                nothing lost

where a notice in the s-th step of the segment saves the s - 1 whole steps done before
it (rounded down to the grid, so the table is slightly pessimistic), and a notice
while the scheduled checkpoint is written saves the segment. M(J, 0) appears on both
sides at t = 0 and is solved in closed form, as in the notice-less table. With q = 0
(or ℓ < δ: a notice too short to write a checkpoint is no notice) this is exactly
the notice-less recursion.

`simulate_makespan_with_notices` is the Monte Carlo counterpart that tests compare
with: continuous time, the notice at X - ℓ, the work done until then saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.checkpoint import (
    CheckpointTable,
    _horizon_h,
    _life_from,
    _snap,
    build_table,
    delta_steps,
)
from policies.preemption import LifetimeModel


@dataclass(frozen=True)
class Notices:
    """Preemption notices: `lead_h` hours ahead, for a `share` of preemptions (0..1)."""

    lead_h: float
    share: float = 1.0

    def __post_init__(self) -> None:
        if not (self.lead_h >= 0 and math.isfinite(self.lead_h)):
            raise ValueError(f"a notice's lead must be a finite time >= 0, not {self.lead_h}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(
                f"the share of preemptions noticed must be in [0, 1], not {self.share}"
            )

    def useful(self, delta_h: float) -> bool:
        """Whether a notice leaves time to write a checkpoint of cost `delta_h`."""
        return self.share > 0 and self.lead_h > 0 and self.lead_h >= delta_h

    def resume_h(self, restart_h: float) -> float:
        """C_n: from a notice to a fresh VM taking the job (replacement launched at the
        notice, ready R later; the old VM dies ℓ after the notice)."""
        return max(self.lead_h, restart_h)


@dataclass(frozen=True)
class _EventCurves:
    """F_u, F_n, G_u, G_n on the grid u_k = k·step (k = 0 .. reach - 1)."""

    u: np.ndarray
    Fu: np.ndarray
    Fn: np.ndarray
    Gu: np.ndarray
    Gn: np.ndarray

    @property
    def survival(self) -> np.ndarray:
        return 1.0 - self.Fu - self.Fn


def _event_curves(
    model: LifetimeModel, notices: Notices, q: float, step_h: float, reach: int
) -> _EventCurves:
    u = _snap(model, np.arange(reach) * step_h)
    lead = notices.lead_h
    F = np.asarray(model.cdf(u), dtype=float)
    G = np.asarray(model.first_moment(0.0, u), dtype=float)
    shifted = _snap(model, u + lead)
    F_lead = float(model.cdf(lead))
    F_shift = np.asarray(model.cdf(shifted), dtype=float)
    # ∫_ℓ^{u+ℓ} (y - ℓ) f(y) dy: the notice comes ℓ before the preemption.
    G_shift = np.asarray(model.first_moment(lead, shifted), dtype=float) - lead * (F_shift - F_lead)
    Z = 1.0 - q * F_lead
    if Z <= 0:
        raise ValueError(
            f"every VM would be noticed at launch (lead {lead:g} h, share {q:g}): no schedule"
        )
    return _EventCurves(
        u=u,
        Fu=(1.0 - q) * F / Z,
        Fn=q * (F_shift - F_lead) / Z,
        Gu=(1.0 - q) * G / Z,
        Gn=q * G_shift / Z,
    )


def build_notice_table(
    model: LifetimeModel,
    max_work_h: float,
    delta_h: float,
    notices: Notices,
    restart_h: float = 0.0,
    step_h: float = 1 / 60,
) -> CheckpointTable:
    """Solve the recursion of the module docstring for every amount of work up to
    `max_work_h` and every VM age, on a grid of `step_h`: a `CheckpointTable` like the
    notice-less one (same lookups). Without useful notices it is `build_table`'s."""
    if not notices.useful(delta_h):
        return build_table(model, max_work_h, delta_h, restart_h, step_h)
    return solve_with_notices(model, max_work_h, delta_h, notices, restart_h, step_h)


def solve_with_notices(
    model: LifetimeModel,
    max_work_h: float,
    delta_h: float,
    notices: Notices,
    restart_h: float,
    step_h: float,
) -> CheckpointTable:
    """The recursion itself, float64, vectorised over ages and first intervals for each
    amount of work J (O(ages·J) per J), whether or not the notices are useful for this δ
    (the daemon decides that on a job's own δ, finer than the grid's; tests run it with
    q = 0 against `build_table`)."""
    n = max(1, round(max_work_h / step_h))
    D = delta_steps(delta_h, step_h)
    ages = round(_horizon_h(model, step_h) / step_h) + 1
    reach = ages + n + D + 1
    curves = _event_curves(model, notices, notices.share, step_h, reach)
    u, Fu, Fn, Gu, Gn = curves.u, curves.Fu, curves.Fn, curves.Gu, curves.Gn
    Se = curves.survival
    C_n = notices.resume_h(restart_h)
    dFn = np.diff(Fn)  # dFn[k]: notices in step (k, k + 1]
    makespan = np.zeros((n + 1, ages))
    choice = np.zeros((n + 1, ages), dtype=np.int32)
    t = np.arange(ages)
    S_t = Se[:ages]
    alive = S_t > 0
    for J in range(1, n + 1):
        i = np.arange(1, J + 1)
        d = np.where(i < J, i + D, i)
        E = t[:, None] + d[None, :]  # segment ends, ages × candidates
        W = makespan[J - np.arange(J + 1), 0]  # W[k] = M(J - k, 0); W[J] = M(0, 0) = 0
        ahead = makespan[(J - i)[None, :], np.minimum(E, ages - 1)]
        Tt = t[:, None]
        cont = Se[E] * (d[None, :] * step_h + np.where(Se[E] > 0, ahead, 0.0))
        to_event = (Gu[E] - Gu[Tt] + Gn[E] - Gn[Tt]) - u[Tt] * (Fu[E] - Fu[Tt] + Fn[E] - Fn[Tt])
        lost_all = Fu[E] - Fu[Tt]  # restart with all J steps
        noticed = Fn[E] - Fn[Tt]
        # Σ_{s=1..i} dFn[t + s - 1]·W[s - 1] for every t and i: a running sum over s.
        window = np.lib.stride_tricks.sliding_window_view(dFn, J)[:ages]
        saved_prefix = np.cumsum(window * W[None, :J], axis=1)
        during_write = (Fn[E] - Fn[Tt + i[None, :]]) * W[None, i]
        known = cont + to_event + lost_all * restart_h + noticed * C_n + during_write
        # The first step's notices save nothing: W[0] = M(J, 0), the unknown at t = 0.
        first_step_noticed = window[:, :1]
        known_no_m0 = known + saved_prefix - first_step_noticed * W[0]
        restarts_with_all = lost_all + first_step_noticed
        # t = 0: M0 = min_i A_i / (1 - c_i) (S_e(0) = 1).
        with np.errstate(divide="ignore", invalid="ignore"):
            at_zero = np.where(
                restarts_with_all[0] < 1.0,
                known_no_m0[0] / (1.0 - restarts_with_all[0]),
                np.inf,
            )
        best0 = int(np.argmin(at_zero))
        m0 = float(at_zero[best0])
        if not math.isfinite(m0):
            makespan[J], choice[J] = np.inf, J
            continue
        totals = known_no_m0 + restarts_with_all * m0
        pick = np.argmin(totals, axis=1)
        best = totals[t, pick]
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(alive, best / np.where(alive, S_t, 1.0), restart_h + m0)
        chosen = np.where(alive, pick + 1, best0 + 1).astype(np.int32)
        values[0], chosen[0] = m0, best0 + 1
        makespan[J], choice[J] = values, chosen
    return CheckpointTable(
        step_h, D, restart_h, n, ages, makespan, choice, deadline=model.L is not None
    )


def simulate_makespan_with_notices(
    model: LifetimeModel,
    table: CheckpointTable,
    work_h: float,
    delta_h: float,
    notices: Notices,
    rng: np.random.Generator,
    restart_h: float = 0.0,
    runs: int = 20_000,
) -> tuple[float, float, float]:
    """Monte Carlo of a job run by `table`'s policy (its schedule looked up again on
    every fresh VM) when a share of preemptions comes with a notice: (mean makespan,
    its standard error, mean hours of work lost). At a notice the job saves the whole
    grid steps of work it has done (as the table counts; a job saves a little more);
    the next VM takes it C_n after the notice. An unannounced preemption loses the
    work since the last checkpoint and costs R. `work_h` is on the table's grid."""
    useful = notices.useful(delta_h)
    C_n = notices.resume_h(restart_h)
    delta_h = table.delta_steps * table.step_h  # a write takes what the table planned for
    totals = np.empty(runs)
    lost = np.empty(runs)
    for run in range(runs):
        left = work_h
        total = lost_h = 0.0
        age = 0.0
        event, announced = _first_event(model, notices, useful, rng)
        plan = list(table.schedule(left, 0.0).intervals_h)
        while plan:
            work = plan[0]
            duration = work + (delta_h if len(plan) > 1 else 0.0)
            if age + duration < event - 1e-9:
                total += duration
                age += duration
                left -= work
                plan.pop(0)
                continue
            into = event - age
            total += into
            if announced:
                # Whole grid steps done before the notice are saved (as the table counts).
                saved = min(math.floor(into / table.step_h + 1e-9) * table.step_h, work)
                left -= saved
                lost_h += min(into, work) - saved
                total += C_n
            else:
                lost_h += min(into, work)
                total += restart_h
            age = 0.0
            event, announced = _first_event(model, notices, useful, rng)
            plan = list(table.schedule(left, 0.0).intervals_h)
        totals[run] = total
        lost[run] = lost_h
    return float(totals.mean()), float(totals.std(ddof=1) / math.sqrt(runs)), float(lost.mean())


def _first_event(
    model: LifetimeModel, notices: Notices, useful: bool, rng: np.random.Generator
) -> tuple[float, bool]:
    """A fresh VM's event: (age, announced). A VM whose notice would come at launch is
    not a fresh VM (the controller would not place work on it): drawn again."""
    while True:
        life = _life_from(model, rng, 0.0)
        if useful and rng.random() < notices.share:
            if life > notices.lead_h:
                return life - notices.lead_h, True
            continue
        return life, False
