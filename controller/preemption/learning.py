"""Learning preemption models from the VMs this controller ran (docs/design.md#preemption-models, "Drift").

Every VM that ran is a lifetime observation: preempted, or censored when spotbag
stopped it or it is still running (at its current age). Every `refit_interval_s` the
learner groups observations by registry key (driver, type, zone, time of day,
day) and refits the bathtub model for a key when it has `min_samples` lifetimes
and either has no learned model yet, has 20% more lifetimes than the model was
fitted on, or its latest `drift_window` lifetimes no longer follow the model in
use (KS test). New models are stored with the reason; the old ones stay as history.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from controller.config import PreemptionConfig
from controller.plumbing.blas import one_blas_thread
from controller.preemption.model_book import ModelBook
from controller.store import Store
from policies.fitting import FitResult, drift_test, fit
from policies.registry import ModelEntry, ModelKey, Observation, group_by_key

log = logging.getLogger("spotbag.learning")


def observations_from(rows: Sequence[Mapping[str, Any]], driver: str) -> list[Observation]:
    return [
        Observation(
            driver,
            row["vm_type"],
            row["zone"] or "*",
            dt.datetime.fromtimestamp(row["requested_at"], dt.UTC),
            max(0.0, row["lifetime_s"]) / 3600.0,
            bool(row["preempted"]),
        )
        for row in rows
    ]


def refits_needed(
    observations: list[Observation],
    book: ModelBook,
    settings: PreemptionConfig,
    rng: np.random.Generator,
    checked: dict[ModelKey, float] | None = None,
) -> list[tuple[ModelKey, list[Observation], str]]:
    """(key, the observations to fit, why) for every key whose model should be (re)fitted.

    Observations come most recently launched first. A key is fitted the first time
    it has `min_samples` lifetimes, refitted (on the model's window plus the new
    lifetimes) once 20% more were launched after its model's data, and
    tested for drift once `drift_window`/2 VMs were launched after its model's data;
    a drifted key is refitted on its recent lifetimes only (the old ones are what
    drifted away), so the next check waits for new data instead of looping. `checked`
    remembers the newest launch each key was tested on: the same data is not tested
    twice (repeated tests of one sample would raise false alarms)."""
    checked = checked if checked is not None else {}
    wanted = []
    for key, group in group_by_key(observations).items():
        if len(group) < settings.min_samples or not any(o.preempted for o in group):
            continue
        current = book.learned.entries.get(key)
        if current is None:
            wanted.append((key, group, f"first fit on {len(group)} lifetimes"))
            continue
        oldest_used = current.stats.get("oldest_launch", 0.0)
        newest_used = current.stats.get("newest_launch", 0.0)
        fresh = sum(1 for o in group if o.launched.timestamp() > newest_used)
        if fresh >= max(10, 0.2 * current.n):
            # More of the same: refit on the model's own window plus the new lifetimes.
            window = [o for o in group if o.launched.timestamp() >= oldest_used]
            wanted.append((key, window, f"{fresh} new lifetimes"))
            continue
        if fresh < settings.drift_window // 2:
            continue
        recent = group[: settings.drift_window]
        newest = recent[0].launched.timestamp()
        if checked.get(key) == newest:
            continue
        checked[key] = newest
        check = drift_test(
            current.model, [o.lifetime_h for o in recent], [o.preempted for o in recent], rng=rng
        )
        if check.drifted:
            keep = group[: max(settings.min_samples, 2 * settings.drift_window)]
            wanted.append(
                (
                    key,
                    keep,
                    f"drift: KS {check.distance:.3f} > {check.threshold:.3f} on the latest "
                    f"{len(recent)} lifetimes; refitted on the latest {len(keep)}",
                )
            )
    return wanted


def family_of(settings: PreemptionConfig) -> tuple[str, float | None]:
    """The model family to learn, and its deadline: what the configuration says VMs
    follow (a bathtub with L for bathtub/fitted, else exponential, with a deadline
    only when one is configured)."""
    if settings.model in ("bathtub", "fitted"):
        return "bathtub", settings.deadline_h
    return "exponential", settings.max_lifetime_h


def fit_entries(
    wanted: list[tuple[ModelKey, list[Observation], str]],
    family: str,
    deadline_h: float | None,
    now: float,
) -> list[tuple[ModelEntry, str]]:
    """Fit `family` for each key (CPU-bound: run in a thread). Keys whose groups hold
    the very same lifetimes (common: a zone with one VM type) share one fit."""
    fitted = []
    results: dict[tuple[int, ...], FitResult | ValueError] = {}
    for key, group, reason in wanted:
        members = tuple(id(o) for o in group)
        if members not in results:
            lifetimes, preempted = [o.lifetime_h for o in group], [o.preempted for o in group]
            try:
                with one_blas_thread():
                    results[members] = fit(lifetimes, preempted, family, "mle", deadline_h)
            except ValueError as exc:
                results[members] = exc
        result = results[members]
        if isinstance(result, ValueError):
            log.warning("no model for %s: %s", key.text(), result)
            continue
        stats = {
            "method": "mle",
            "r2": result.r2,
            "ks": result.ks,
            "aic": result.aic,
            "log_likelihood": result.log_likelihood,
            # The launches it saw: new data and drift are judged against them.
            "oldest_launch": min(o.launched.timestamp() for o in group),
            "newest_launch": max(o.launched.timestamp() for o in group),
        }
        entry = ModelEntry(key, result.model, result.n, result.censored, stats, "learned", now)
        fitted.append((entry, reason))
    return fitted


class Learner:
    def __init__(
        self,
        store: Store,
        book: ModelBook,
        settings: PreemptionConfig,
        driver: str,
        now: Callable[[], float],
    ) -> None:
        self.store = store
        self.book = book
        self.settings = settings
        self.driver = driver
        self.now = now
        self.rng = np.random.default_rng()  # the drift test's bootstrap
        self.checked: dict[ModelKey, float] = {}  # key -> newest launch its drift was tested on

    async def load(self) -> int:
        """Use the models learned before a restart."""
        entries = [ModelEntry.from_dict(row) for row in await self.store.models()]
        self.book.learn(entries)
        return len(entries)

    async def refit_once(self) -> list[ModelEntry]:
        rows = await self.store.lifetime_observations(self.driver, self.now())
        wanted = await asyncio.to_thread(
            refits_needed,
            observations_from(rows, self.driver),
            self.book,
            self.settings,
            self.rng,
            self.checked,
        )
        if not wanted:
            return []
        family, deadline_h = family_of(self.settings)
        fitted = await asyncio.to_thread(fit_entries, wanted, family, deadline_h, self.now())
        if fitted:
            await self.store.save_models(
                [dict(entry.to_dict(), reason=reason) for entry, reason in fitted], ""
            )
            self.book.learn([entry for entry, _ in fitted])
            for entry, reason in fitted:
                log.info("learned a model for %s (%s): %s", entry.key.text(), reason, entry.model)
        return [entry for entry, _ in fitted]

    async def run(self) -> None:
        """Refit every refit_interval_s until cancelled; a failed refit is logged and retried."""
        while True:
            await asyncio.sleep(self.settings.refit_interval_s)
            try:
                await self.refit_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("refitting preemption models failed")
