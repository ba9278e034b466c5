"""Which preemption model applies to a VM: a registry keyed by provider, VM type,
zone, time-of-day bucket and weekday/weekend (docs/design.md#preemption-models, "Models are keyed ...").

A lookup tries keys from the most specific to the coarsest and returns the first
model fitted on at least `min_samples` lifetimes; "*" matches anything. Larger
VMs are preempted more and nights are calmer, so the specific keys matter when
there is data for them, and the coarse ones keep every VM covered when not.

Time-of-day buckets are 6-hour blocks of UTC (night 0-6, morning 6-12, afternoon
12-18, evening 18-24); days are "weekday" or "weekend" (UTC).
The registry is plain data: `to_dict` / `from_dict` convert it for storage.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from policies.preemption import LifetimeModel, make_model

ANY = "*"
TIME_OF_DAY = ("night", "morning", "afternoon", "evening")


# A GCE zone is its region and a letter; an AWS availability zone is its region and a
# letter, or a Local/Wavelength Zone's suffix (drivers/aws.py reads AWS zones the same
# way; drivers may not import policies, tests/policies/test_registry.py keeps the two equal).
_GCE_ZONE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
_AWS_ZONE = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d+)(?:[a-z]|-.+)$")


def region_of(zone: str) -> str:
    """The region of a zone: us-central1-c -> us-central1 (GCE), us-east-1a -> us-east-1
    and us-west-2-lax-1a -> us-west-2 (AWS); any other name (a region, "local") is its
    own region. The one rule for the registry's keys, `spotbag fit --by region` and
    `spotbag index --by region`."""
    match = _GCE_ZONE.fullmatch(zone) or _AWS_ZONE.fullmatch(zone)
    return match.group(1) if match else zone


def time_of_day(moment: dt.datetime) -> str:
    return TIME_OF_DAY[moment.astimezone(dt.UTC).hour // 6]


def day_kind(moment: dt.datetime) -> str:
    return "weekend" if moment.astimezone(dt.UTC).weekday() >= 5 else "weekday"


@dataclass(frozen=True, order=True)
class ModelKey:
    provider: str = ANY
    vm_type: str = ANY
    zone: str = ANY  # a zone, a region, or "*"
    time_of_day: str = ANY
    day: str = ANY

    def text(self) -> str:
        return "/".join((self.provider, self.vm_type, self.zone, self.time_of_day, self.day))

    @classmethod
    def parse(cls, text: str) -> ModelKey:
        """'gce/n1-highcpu-16/us-central1-c' (missing parts are '*')."""
        parts = [p or ANY for p in text.split("/")]
        if len(parts) > 5:
            raise ValueError(
                f"a model key has at most 5 parts (provider/type/zone/time/day): {text!r}"
            )
        return cls(*parts)

    def specificity(self) -> int:
        return sum(
            part != ANY
            for part in (self.provider, self.vm_type, self.zone, self.time_of_day, self.day)
        )


def fallback_keys(
    provider: str, vm_type: str, zone: str, when: dt.datetime | None = None
) -> list[ModelKey]:
    """Keys to try, most specific first, for a VM launched at `when`."""
    tod = time_of_day(when) if when is not None else ANY
    day = day_kind(when) if when is not None else ANY
    region = region_of(zone)
    candidates = [
        (provider, vm_type, zone, tod, day),
        (provider, vm_type, zone, tod, ANY),
        (provider, vm_type, zone, ANY, day),
        (provider, vm_type, zone, ANY, ANY),
        (provider, vm_type, region, ANY, ANY),
        (provider, vm_type, ANY, tod, ANY),
        (provider, vm_type, ANY, ANY, day),
        (provider, vm_type, ANY, ANY, ANY),
        (provider, ANY, zone, ANY, ANY),
        (provider, ANY, region, ANY, ANY),
        (provider, ANY, ANY, tod, ANY),
        (provider, ANY, ANY, ANY, day),
        (provider, ANY, ANY, ANY, ANY),
        (ANY, ANY, ANY, ANY, ANY),
    ]
    keys: list[ModelKey] = []
    for parts in candidates:
        key = ModelKey(*parts)
        if key not in keys:
            keys.append(key)
    return keys


@dataclass(frozen=True)
class ModelEntry:
    key: ModelKey
    model: LifetimeModel
    n: int  # lifetimes it was fitted on
    censored: int
    stats: dict = field(default_factory=dict)  # fit quality (r2, ks, aic, log_likelihood, ...)
    source: str = "default"  # "default" (shipped), "fitted" (learned online), "config"
    fitted_at: float = 0.0  # epoch seconds

    def to_dict(self) -> dict:
        return {
            "key": self.key.text(),
            "model": self.model.name,
            "parameters": self.model.parameters,
            "L": self.model.L,
            "n": self.n,
            "censored": self.censored,
            "stats": self.stats,
            "source": self.source,
            "fitted_at": self.fitted_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelEntry:
        return cls(
            key=ModelKey.parse(data["key"]),
            model=make_model(data["model"], data["parameters"], data.get("L")),
            n=int(data["n"]),
            censored=int(data.get("censored", 0)),
            stats=dict(data.get("stats", {})),
            source=data.get("source", "default"),
            fitted_at=float(data.get("fitted_at", 0.0)),
        )


@dataclass(frozen=True)
class ModelRegistry:
    entries: dict[ModelKey, ModelEntry]  # not changed once made: `with_entries` copies
    min_samples: int = 30
    # What `lookup` found for (provider, type, zone, time of day, day): the scheduler
    # asks at every launch, and each answer tries up to 14 keys.
    _found: dict[tuple[str, str, str, str, str], ModelEntry | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def min_preemptions(self) -> int:
        """Preemptions a model must have seen: lifetimes that are nearly all censored
        early tell little about the rest of a VM's life."""
        return max(10, self.min_samples // 2)

    def lookup(
        self, provider: str, vm_type: str, zone: str, when: dt.datetime | None = None
    ) -> ModelEntry | None:
        """The most specific model with enough samples and preemptions, or None."""
        if not self.entries:
            return None
        moment = (time_of_day(when), day_kind(when)) if when is not None else (ANY, ANY)
        asked = (provider, vm_type, zone, *moment)
        if asked in self._found:
            return self._found[asked]
        found = None
        for key in fallback_keys(provider, vm_type, zone, when):
            entry = self.entries.get(key)
            if (
                entry is not None
                and entry.n >= self.min_samples
                and entry.n - entry.censored >= self.min_preemptions
            ):
                found = entry
                break
        self._found[asked] = found
        return found

    def with_entries(self, entries: Iterable[ModelEntry]) -> ModelRegistry:
        """A registry where the given entries replace those with the same key."""
        merged = dict(self.entries)
        for entry in entries:
            merged[entry.key] = entry
        return ModelRegistry(merged, self.min_samples)

    def to_dict(self) -> dict:
        return {
            "min_samples": self.min_samples,
            "models": [self.entries[k].to_dict() for k in sorted(self.entries)],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ModelRegistry:
        entries = [ModelEntry.from_dict(item) for item in data.get("models", [])]
        return cls({e.key: e for e in entries}, int(data.get("min_samples", 30)))


@dataclass(frozen=True)
class Observation:
    """One VM's life: how long it lived, whether it was preempted (else censored)."""

    provider: str
    vm_type: str
    zone: str
    launched: dt.datetime
    lifetime_h: float
    preempted: bool

    def registry_keys(self) -> list[ModelKey]:
        """Every registry key this observation counts toward."""
        return fallback_keys(self.provider, self.vm_type, self.zone, self.launched)


def group_by_key(observations: Sequence[Observation]) -> dict[ModelKey, list[Observation]]:
    groups: dict[ModelKey, list[Observation]] = {}
    for observation in observations:
        for key in observation.registry_keys():
            groups.setdefault(key, []).append(observation)
    return groups


def fit_registry(
    observations: Sequence[Observation],
    *,
    min_samples: int = 30,
    L: float | None = 24.0,
    method: str = "mle",
    source: str = "default",
    fitted_at: float = 0.0,
    compare: bool = False,
) -> ModelRegistry:
    """Fit a bathtub model for every key with at least `min_samples` lifetimes (and at
    least one preemption). With `compare`, the other families' fit statistics are kept
    beside it in `stats["alternatives"]`."""
    from policies.fitting import fit, fit_all  # fitting is heavier; import on use

    entries: dict[ModelKey, ModelEntry] = {}
    shared: dict[tuple[int, ...], ModelEntry] = {}  # keys with the very same lifetimes share a fit
    for key, group in group_by_key(observations).items():
        lifetimes = [o.lifetime_h for o in group]
        preempted = [o.preempted for o in group]
        if len(group) < min_samples or not any(preempted):
            continue
        members = tuple(id(o) for o in group)
        if members in shared:
            entries[key] = replace(shared[members], key=key)
            continue
        if compare:
            results = fit_all(lifetimes, preempted, method=method, L=L)
            result = results["bathtub"]
            alternatives = {
                name: {"aic": r.aic, "ks": r.ks, "r2": r.r2, "log_likelihood": r.log_likelihood}
                for name, r in results.items()
                if name != "bathtub"
            }
        else:
            result = fit(lifetimes, preempted, "bathtub", method, L)
            alternatives = {}
        stats = {
            "method": method,
            "r2": result.r2,
            "ks": result.ks,
            "aic": result.aic,
            "log_likelihood": result.log_likelihood,
        }
        if alternatives:
            stats["alternatives"] = alternatives
        entries[key] = shared[members] = ModelEntry(
            key, result.model, result.n, result.censored, stats, source, fitted_at
        )
    return ModelRegistry(entries, min_samples)
