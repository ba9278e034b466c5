"""controller/formatting.py: the one way figures are printed (issue 24). Properties over
every float (hypothesis), then the examples the issue names. Its JavaScript twin is
checked against it, value by value, in tests/integration/test_web_ui.py."""

from __future__ import annotations

import math
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.formatting import (
    NOISE,
    duration,
    number,
    percent,
    plural,
    signed_percent,
    usd,
)

finite = st.floats(allow_nan=False, allow_infinity=False)
PLAIN = re.compile(r"-?\d{1,3}(,\d{3})*(\.\d+)?")  # no exponent, grouped thousands


def value_of(text: str) -> Decimal:
    return Decimal(text.replace(",", "").replace("$", ""))


@settings(max_examples=2000, deadline=None)
@given(finite)
def test_a_quantity_is_plain_digits_never_minus_zero_and_never_zero_unless_it_is(x):
    text = number(x)
    assert PLAIN.fullmatch(text), text
    assert "e" not in text.lower()
    shown = value_of(text)
    if shown == 0:
        assert abs(x) < NOISE and not text.startswith("-"), (x, text)
    else:
        assert (shown < 0) == (x < 0), (x, text)  # the sign survives


@settings(max_examples=2000, deadline=None)
@given(finite.filter(lambda x: abs(x) >= NOISE))
def test_a_quantity_keeps_three_significant_digits_and_two_decimals(x):
    text = number(x)
    shown = value_of(text)
    # Three significant digits at least: the error is below half a unit of the third.
    exponent = math.floor(math.log10(abs(x)))
    assert abs(shown - Decimal(x)) <= Decimal(10) ** (exponent - 2) / 2 * Decimal("1.0001")
    # And never fewer than cents.
    assert len(text.partition(".")[2]) >= 2


@settings(max_examples=1000, deadline=None)
@given(finite)
def test_money_puts_the_sign_before_the_dollar(x):
    text = usd(x)
    assert re.fullmatch(r"-?\$" + PLAIN.pattern.lstrip("-?"), text), text
    assert text.replace("$", "") == number(x)


@settings(max_examples=1000, deadline=None)
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_a_percentage_is_never_minus_zero_and_keeps_its_sign(fraction):
    text = percent(fraction)
    assert text.endswith(" %") and not re.match(r"-0( |$)", text), text
    signed = signed_percent(fraction)
    if value_of(text[:-2]) == 0:
        assert signed == "0 %"
    else:
        assert signed[0] == ("-" if fraction < 0 else "+"), (fraction, signed)


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_a_duration_picks_its_unit_and_is_never_zero_unless_it_is(seconds):
    text = duration(seconds)
    match = re.fullmatch(r"(-?[\d,]+(?:\.\d+)?) (ms|s|min|h|d)", text)
    assert match, text
    shown, unit = value_of(match[1]), match[2]
    if shown == 0:
        assert text == "0 s" and abs(seconds) < NOISE
        return
    assert (shown < 0) == (seconds < 0)
    scale = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}[unit]
    # Three significant digits of the value in its unit.
    assert math.isclose(float(shown) * scale, seconds, rel_tol=5e-3), (seconds, text)
    magnitude = abs(seconds)
    expected = (
        "ms"
        if magnitude < 1
        else "s"
        if magnitude < 90
        else "min"
        if magnitude < 5400
        else "h"
        if magnitude < 72 * 3600
        else "d"
    )
    assert unit == expected, (seconds, text)


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.000836, "$0.000836"),  # status's figure, which report --format table showed as 0.00
        (6.521e-06, "$0.00000652"),  # the HTML report's 6.521e-06
        (-0.0, "$0.00"),
        (-1e-17, "$0.00"),  # float noise of a difference: no -0
        (0.02, "$0.02"),
        (0.5, "$0.50"),
        (12.345678, "$12.35"),
        (1234567.891, "$1,234,567.89"),
        (-0.0213, "-$0.0213"),
        (0.5625, "$0.563"),  # an exact tie: half away from zero, as JavaScript rounds
        (None, ""),
    ],
)
def test_money_examples(x, text):
    assert usd(x) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (27.2, "27.2 s"),  # the CLI's "27.2 s of work lost" (the page said 0.01 hours)
        (0.0, "0 s"),
        (0.35, "350 ms"),
        (5, "5.0 s"),
        (750, "12.5 min"),
        (3.2 * 3600, "3.2 h"),
        (4.1 * 86400, "4.1 d"),
        (-30, "-30.0 s"),
    ],
)
def test_duration_examples(seconds, text):
    assert duration(seconds) == text


def test_percent_and_plural_examples():
    assert percent(0.456) == "46 %" and percent(0.0031) == "0.31 %" and percent(0) == "0 %"
    assert signed_percent(-0.000001) == "-0.0001 %" and signed_percent(-1e-13) == "0 %"
    assert signed_percent(0.12) == "+12 %"
    assert plural(1, "VM type") == "1 VM type" and plural(2, "VM type") == "2 VM types"
    assert plural(1200, "entry", "entries") == "1,200 entries"
    assert number(float("nan")) == "n/a" and usd(float("inf")) == "$∞"
