"""The model registry: keys, fallback to coarser keys, and the shipped defaults."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from controller.preemption.model_book import load_registry
from controller.traces.reference_data import LIFETIMES
from policies.fitting import fit
from policies.preemption import Bathtub, Exponential
from policies.registry import (
    ModelEntry,
    ModelKey,
    ModelRegistry,
    Observation,
    day_kind,
    fallback_keys,
    fit_registry,
    region_of,
    time_of_day,
)

SATURDAY_NIGHT = dt.datetime(2026, 11, 21, 2, 30, tzinfo=dt.UTC)


def entry(key: str, n: int, mttf: float) -> ModelEntry:
    return ModelEntry(ModelKey.parse(key), Exponential(mttf, L=24.0), n, 0)


def test_key_parts():
    assert region_of("us-central1-c") == "us-central1"
    assert region_of("local") == "local"
    assert region_of("us-central1-c\n") == "us-central1-c\n"  # a whole name, or its own
    assert time_of_day(SATURDAY_NIGHT) == "night" and day_kind(SATURDAY_NIGHT) == "weekend"
    assert ModelKey.parse("gce/n1-highcpu-16").text() == "gce/n1-highcpu-16/*/*/*"
    with pytest.raises(ValueError):
        ModelKey.parse("a/b/c/d/e/f")


def test_lookup_falls_back_from_specific_keys_with_too_few_samples():
    keys = fallback_keys("gce", "n1-highcpu-16", "us-central1-c", SATURDAY_NIGHT)
    assert keys[0] == ModelKey("gce", "n1-highcpu-16", "us-central1-c", "night", "weekend")
    assert keys[4] == ModelKey("gce", "n1-highcpu-16", "us-central1", "*", "*")
    assert keys[-1] == ModelKey()
    registry = ModelRegistry(
        {
            e.key: e
            for e in [
                entry("gce/n1-highcpu-16/us-central1-c/night/weekend", 12, 1.0),  # too few
                entry("gce/n1-highcpu-16/us-central1", 40, 2.0),
                entry("gce", 500, 3.0),
                entry("*", 900, 4.0),
            ]
        },
        min_samples=30,
    )
    assert (
        registry.lookup("gce", "n1-highcpu-16", "us-central1-c", SATURDAY_NIGHT).model.mttf_h == 2.0
    )
    assert registry.lookup("gce", "n1-highcpu-32", "us-east1-b").model.mttf_h == 3.0
    assert registry.lookup("aws", "c5.large", "us-east-1a").model.mttf_h == 4.0
    assert ModelRegistry({}, 30).lookup("gce", "x", "y") is None
    again = ModelRegistry.from_dict(registry.to_dict())
    assert again.entries.keys() == registry.entries.keys() and again.min_samples == 30


@pytest.mark.slow
def test_fit_registry_fits_every_key_with_enough_lifetimes():
    rng = np.random.default_rng(5)
    truth = Bathtub(A=0.4, tau1=1.5, tau2=1.0, b=25.0, L=24.0)
    lives = truth.sample_h(rng, 120)
    observations = [
        Observation("gce", "t1" if i % 2 else "t2", "us-east1-b", SATURDAY_NIGHT, float(life), True)
        for i, life in enumerate(lives)
    ]
    registry = fit_registry(observations, min_samples=50, L=24.0)
    assert ModelKey("gce", "t1", "us-east1-b") in registry.entries  # 60 each
    assert ModelKey("gce", "t1", "us-east1-b", "night", "weekend") in registry.entries
    assert all(e.n >= 50 and isinstance(e.model, Bathtub) for e in registry.entries.values())
    assert registry.entries[ModelKey()].n == 120


def test_shipped_defaults_cover_the_dataset():
    registry = load_registry()
    assert len(registry.entries) > 20
    pooled = registry.entries[ModelKey()]
    assert pooled.n == 1442 and isinstance(pooled.model, Bathtub)
    # The bathtub beat the classic models when the defaults were made (stats are stored).
    assert all(pooled.stats["aic"] < alt["aic"] for alt in pooled.stats["alternatives"].values())
    specific = registry.lookup("gce", "n1-highcpu-16", "us-central1-c")
    assert specific.key.vm_type == "n1-highcpu-16"
    assert registry.lookup("gce", "e2-medium", "asia-east1-a").key == ModelKey("gce")


@pytest.mark.slow
def test_the_shipped_pooled_model_is_what_the_data_gives():
    import csv

    rows = list(csv.DictReader(LIFETIMES.open()))
    result = fit(
        [float(r["lifetime_s"]) / 3600 for r in rows], [r["event"] == "preempted" for r in rows]
    )
    shipped = load_registry().entries[ModelKey()].model
    grid = np.linspace(0, 24, 97)
    assert np.max(np.abs(result.model.cdf(grid) - shipped.cdf(grid))) < 0.005
