"""`spotbag fit`'s fits on the shipped lifetimes stay those of the code before the
performance work of issue 24 (one BLAS thread, lazy imports): the same parameters,
log-likelihood, KS and R² (recorded from that code; they agree to the last bit, the
tolerances only leave room for a different BLAS or scipy build)."""

from __future__ import annotations

import pytest

from controller.tools.lifetime_data import group_value, read_lifetimes
from controller.tools.model_fits import fit_groups
from controller.traces.reference_data import LIFETIMES

# group/model: parameters and (logL, KS, R²), as the previous code printed them.
BEFORE = {
    ("all", "bathtub"): (
        {"A": 0.247605064, "tau1": 1.12727636, "tau2": 52.9581008, "b": 0.001},
        (-1364.37067, 0.0309228479, 0.981258213),
    ),
    ("all", "exponential"): ({"mttf_h": 16.905245}, (-2744.40633, 0.372712346, 0.731517746)),
    ("all", "weibull"): (
        {"k": 0.809133381, "lam": 16.9688024},
        (-2717.1354, 0.348356091, 0.756062005),
    ),
    ("all", "gompertz_makeham"): (
        {"lam": 0.0303452639, "alpha": 1e-15, "beta": 1.43556992},
        (-1876.4865, 0.362410073, 0.7875057),
    ),
    ("machine_type=n1-highcpu-16", "bathtub"): (
        {"A": 0.350750887, "tau1": 2.30976701, "tau2": 109.736187, "b": 0.00100000039},
        (-260.513723, 0.0494865941, 0.944205861),
    ),
    ("machine_type=n1-highcpu-16", "exponential"): (
        {"mttf_h": 15.232648},
        (-491.494193, 0.36586002, 0.791265536),
    ),
    ("machine_type=n1-highcpu-16", "weibull"): (
        {"k": 0.807045399, "lam": 15.0194812},
        (-486.049771, 0.340943912, 0.814639824),
    ),
    ("machine_type=n1-highcpu-16", "gompertz_makeham"): (
        {"lam": 0.035545689, "alpha": 1e-15, "beta": 1.43614365},
        (-346.022515, 0.348646359, 0.79147817),
    ),
}


@pytest.fixture(scope="module")
def fitted():
    observations = read_lifetimes(LIFETIMES, "gce")
    found = {}
    for columns in ([], ["machine_type"]):
        groups, _ = fit_groups(
            observations,
            columns,
            group_value,
            method="mle",
            L=24.0,
            classic_deadline=False,
            min_samples=30,
        )
        for group in groups:
            for name, result in group.fits.items():
                found[(group.title, name)] = result
    return found


@pytest.mark.parametrize("key", sorted(BEFORE))
def test_fits_on_the_shipped_lifetimes_are_those_of_the_previous_code(fitted, key):
    parameters, (log_likelihood, ks, r2) = BEFORE[key]
    result = fitted[key]
    assert result.model.parameters == pytest.approx(parameters, rel=1e-5, abs=1e-12)
    assert result.log_likelihood == pytest.approx(log_likelihood, abs=1e-3)
    assert result.ks == pytest.approx(ks, abs=1e-6)
    assert result.r2 == pytest.approx(r2, abs=1e-6)
