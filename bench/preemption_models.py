#!/usr/bin/env python3
"""Benchmark and evaluation of the preemption models (issue 3).

Prints:
1. the model comparison on the real lifetimes (the shipped goog-preemption data,
   controller/data/reference/),
   for n1-highcpu-16 and for all VMs pooled: R², KS, log-likelihood and AIC of the
   bathtub model against exponential, Weibull and Gompertz–Makeham, both as the
   classic models are published (no deadline) and with the 24 h point mass too;
2. the CPU time to fit all 1,442 lifetimes with all four models (target <= 2 s);
3. the time of one reuse decision, vectorised over 100,000 job/VM pairs (target
   <= 50 µs), and of one table lookup as the scheduler makes it;
4. the paper's scheduling result for the n1-highcpu-16 model: 6-hour jobs started at
   VM ages 0-23 h, job failure probability when always reusing the VM (memoryless
   thinking) versus the model policy, a simulation of both with the model's own
   sampler (a check of the formulas, not of the model), and the means over job
   lengths 1-20 h. Plots go to bench/results/.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from charts import plot_reuse_evaluation  # noqa: E402  (bench/charts.py)
from targets import against  # noqa: E402  (bench/targets.py)

from controller.plumbing.blas import one_blas_thread  # noqa: E402
from controller.tools.lifetime_data import read_lifetimes  # noqa: E402
from controller.tools.plots import plot_fits  # noqa: E402
from controller.traces.reference_data import LIFETIMES  # noqa: E402
from policies.fitting import at_deadline, fit, fit_all, kaplan_meier  # noqa: E402
from policies.reuse import ReuseTable, failure_probability, should_reuse  # noqa: E402

DATA = LIFETIMES  # shipped with spotbag (controller/data/reference/)
RESULTS = Path(__file__).resolve().parent / "results"
LAUNCH_H = 1 / 60  # a fresh VM takes a minute to launch and boot


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = read_lifetimes(DATA)
    t = np.array([r.lifetime_h for r in rows])
    preempted = np.array([r.preempted for r in rows])
    types = np.array([r.vm_type for r in rows])
    return t, preempted, types


def comparison(t, preempted, label: str) -> dict:
    print(
        f"\n{label}: {len(t)} VMs, {int(preempted.sum())} preempted, {int((~preempted).sum())} censored"
    )
    print(f"  {'model':34s} {'R²':>6s} {'KS':>6s} {'log L':>9s} {'AIC':>8s}")
    fits = {"bathtub": fit(t, preempted, "bathtub")}
    for name in ("exponential", "weibull", "gompertz_makeham"):
        fits[name] = fit(t, preempted, name, L=None)
    for name in ("exponential", "weibull", "gompertz_makeham"):
        fits[f"{name} + 24 h mass"] = fit(t, preempted, name, L=24.0)
    for name, r in fits.items():
        print(f"  {name:34s} {r.r2:6.3f} {r.ks:6.3f} {r.log_likelihood:9.1f} {r.aic:8.1f}")
    return fits


def monte_carlo_failure(
    model, age_h: float, length_h: float, reuse: bool, rng, runs: int = 200_000
) -> float:
    """Simulated failure rate of one job: on the VM of age s (drawn conditional on being
    alive at s) when reusing, else on a fresh VM. A VM reclaimed exactly when the job
    would end (the deadline) counts as a failure, as in the model."""
    if not reuse:
        return float(np.mean(model.sample_h(rng, runs) <= length_h))
    draws = model.sample_h(rng, runs * 20)
    alive = draws[draws > age_h]
    return float(np.mean(alive - age_h <= length_h))


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    t, preempted, types = load()

    print("== 1. model comparison on the real lifetimes (MLE with right censoring)")
    sixteen = types == "n1-highcpu-16"
    fits16 = comparison(t[sixteen], preempted[sixteen], "n1-highcpu-16")
    comparison(t, preempted, "all VMs pooled")

    print("\n== 2. fitting all 1,442 lifetimes with all four models")
    # As `spotbag fit` runs them: one BLAS thread (controller/plumbing/blas.py). CPU seconds, which
    # a busy host inflates less than wall time.
    timings, cpu_timings = [], []
    with one_blas_thread():
        for _ in range(3):
            started, cpu_started = time.perf_counter(), time.process_time()
            fit_all(t, preempted)
            timings.append(time.perf_counter() - started)
            cpu_timings.append(time.process_time() - cpu_started)
    runs = ", ".join(f"{x:.2f}" for x in timings)
    cpu_runs = ", ".join(f"{x:.2f}" for x in cpu_timings)
    print(
        f"  {min(cpu_timings):.2f} s CPU (best of 3; CPU runs: {cpu_runs} s; wall: {runs} s) "
        f"{against(min(cpu_timings), 2, 's')}"
    )

    model = fits16["bathtub"].model
    print(f"\n== 3. reuse decisions ({model})")
    rng = np.random.default_rng(1)
    ages, lengths = rng.uniform(0, 24, 100_000), rng.uniform(0.1, 20, 100_000)
    started = time.perf_counter()
    should_reuse(model, ages, lengths, LAUNCH_H)
    vector_us = (time.perf_counter() - started) / 100_000 * 1e6
    table = ReuseTable.build(model, LAUNCH_H)
    started = time.perf_counter()
    for a, length in zip(ages[:20_000].tolist(), lengths[:20_000].tolist(), strict=True):
        table.reuse_ok(a, length)
    lookup_us = (time.perf_counter() - started) / 20_000 * 1e6
    print(
        f"  vectorised exact decision: {vector_us:.2f} µs per job/VM pair (100,000 pairs) "
        f"{against(vector_us, 50, 'µs')}"
    )
    print(
        f"  table lookup as the scheduler does it: {lookup_us:.2f} µs per decision "
        f"{against(lookup_us, 50, 'µs')}"
    )

    print("\n== 4. the paper's scheduling result: 6-hour jobs by VM age (n1-highcpu-16 model)")
    job_h = 6.0
    start_ages = np.arange(0.0, 24.0, 1.0)
    always = failure_probability(model, start_ages, job_h, LAUNCH_H, "always")
    policy = failure_probability(model, start_ages, job_h, LAUNCH_H, "model")
    reuse = should_reuse(model, start_ages, job_h, LAUNCH_H)
    # A replacement starts at its boot age.
    fresh = float(model.conditional_failure(LAUNCH_H, job_h))
    print(f"  fresh VM: {fresh:.3f}")
    print(f"  {'age h':>5s} {'always':>7s} {'(MC)':>7s} {'model':>7s} {'(MC)':>7s}  decision")
    mc_rng = np.random.default_rng(2)
    for age, a, m, r in zip(start_ages, always, policy, reuse, strict=True):
        a_mc = monte_carlo_failure(model, age, job_h, True, mc_rng)
        m_mc = monte_carlo_failure(model, age, job_h, bool(r), mc_rng)
        print(
            f"  {age:5.0f} {a:7.3f} {a_mc:7.3f} {m:7.3f} {m_mc:7.3f}  {'reuse' if r else 'fresh VM'}"
        )
    job_lengths = np.arange(1.0, 21.0, 1.0)
    mean_always = np.array(
        [failure_probability(model, start_ages, L, LAUNCH_H, "always").mean() for L in job_lengths]
    )
    mean_model = np.array(
        [failure_probability(model, start_ages, L, LAUNCH_H, "model").mean() for L in job_lengths]
    )
    print("  mean over start ages 0-23 h, by job length:")
    for L, a, m in zip(job_lengths, mean_always, mean_model, strict=True):
        print(f"    {L:4.0f} h: always {a:.3f}, model {m:.3f}")
    print(
        f"  mean over job lengths 1-20 h: always {mean_always.mean():.3f}, model {mean_model.mean():.3f} "
        f"({mean_always.mean() / mean_model.mean():.1f}× fewer failures)"
    )

    plot_reuse_evaluation(
        start_ages,
        always,
        policy,
        fresh,
        job_lengths,
        mean_always,
        mean_model,
        job_h,
        "n1-highcpu-16",
        RESULTS / "reuse_policy.png",
    )
    groups = []
    for label, mask in (("n1-highcpu-16", sixteen), ("all VMs", np.ones_like(sixteen))):
        fits = {"bathtub": fit(t[mask], preempted[mask], "bathtub")}
        fits |= {
            n: fit(t[mask], preempted[mask], n, L=None)
            for n in ("exponential", "weibull", "gompertz_makeham")
        }
        groups.append(
            (
                label,
                kaplan_meier(at_deadline(t[mask], preempted[mask], 24.0, 0.25), preempted[mask]),
                fits,
            )
        )
    plot_fits(groups, RESULTS / "fits.png")
    print(f"\nplots: {RESULTS / 'reuse_policy.png'}, {RESULTS / 'fits.png'}")


if __name__ == "__main__":
    main()
