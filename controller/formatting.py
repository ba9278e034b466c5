"""One way to print money, quantities, percentages and durations: the CLI, the cost
reports, the plots and (through controller/web/static/format.js, its twin, checked
against this module in tests/integration/test_web_ui.py) the web pages.

The rules (issue 24):

- A quantity keeps at least `places` decimals and at least `significant` significant
  digits, the trailing zeros beyond `places` dropped: $12.35, $0.50, $0.0213,
  $0.000836. So a non-zero amount never prints as 0.00 and nothing is in scientific
  notation (6.521e-06 is $0.00000652).
- Magnitudes below `NOISE` (1e-9) are zero: float noise of sums and differences of
  dollars (about 1e-16 of the sum) is never shown, and a zero never has a sign (no -0).
- Rounding is of the exact binary value, half away from zero (integer arithmetic on
  the float's ratio): what JavaScript's toFixed and toExponential do, so that the pages
  print what this module prints.
- Durations pick their unit by size: ms below 1 s, s below 90 s, min below 90 min,
  h below 72 h, then days.

Standard library only (math): the CLI imports it on every command (`spotbag status`).
"""

from __future__ import annotations

import math

# Below this magnitude a figure is zero: float noise, never a real amount (a spot VM at
# $0.004/h costs 1e-9 dollars in under a millisecond).
NOISE = 1e-9


def _scaled(numerator: int, denominator: int, power: int) -> int:
    """round(numerator / denominator * 10**power), half away from zero (all positive),
    in exact integer arithmetic: JavaScript's toFixed rounds the same exact value."""
    if power >= 0:
        numerator *= 10**power
    else:
        denominator *= 10**-power
    return (2 * numerator + denominator) // (2 * denominator)


def _digits(magnitude: float, places: int, significant: int) -> str:
    """`magnitude` (>= NOISE, finite) with max(places, enough for `significant`
    significant digits) decimals, then trailing zeros beyond `places` dropped."""
    n, d = magnitude.as_integer_ratio()  # exact: the float is n / d
    # The decimal exponent after rounding to `significant` digits (0.0009996 -> 1.00e-3):
    # from log10's estimate, corrected by the exact rounding.
    exponent = math.floor(math.log10(magnitude))
    while _scaled(n, d, significant - 1 - exponent) >= 10**significant:
        exponent += 1
    while _scaled(n, d, significant - 1 - exponent) < 10 ** (significant - 1):
        exponent -= 1
    decimals = max(places, significant - 1 - exponent)
    whole, fraction = divmod(_scaled(n, d, decimals), 10**decimals)
    text = str(fraction).rjust(decimals, "0") if decimals else ""
    if decimals > places:
        text = text.rstrip("0").ljust(places, "0")
    return f"{whole:,}.{text}" if text else f"{whole:,}"


def number(value: float | None, places: int = 2, significant: int = 3) -> str:
    """A quantity: 1,234.57, 0.50, 0.000836, 0 (see the module's rules); '' for None."""
    if value is None:
        return ""
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if abs(value) < NOISE:
        return "0." + "0" * places if places else "0"
    sign = "-" if value < 0 else ""
    return sign + _digits(abs(value), places, significant)


def usd(value: float | None) -> str:
    """US dollars, the sign before the $: $1,234.57, $0.50, $0.000836, -$0.0213."""
    text = number(value)
    if not text or text == "n/a":
        return text
    return f"-${text[1:]}" if text.startswith("-") else f"${text}"


def percent(fraction: float | None, significant: int = 2) -> str:
    """A fraction as a percentage with `significant` significant digits, or whole
    percents when those are more: 46 %, 5.3 %, 0.31 %, 0 % (two digits); 37.4 % (three)."""
    if fraction is None:
        return ""
    text = number(100.0 * fraction, places=0, significant=significant)
    return text if text == "n/a" else f"{text} %"


def signed_percent(fraction: float) -> str:
    """A change as a percentage with its sign: +12 %, -0.31 %, 0 % (a zero has none)."""
    text = percent(fraction)
    return text if text.startswith(("-", "0 ", "n/a")) else f"+{text}"


_UNITS = ((90.0, 1.0, "s"), (90 * 60.0, 60.0, "min"), (72 * 3600.0, 3600.0, "h"))


def duration(seconds: float | None) -> str:
    """A duration in the unit its size calls for: 350 ms, 27.2 s, 12.5 min, 3.2 h,
    4.1 d (at least one decimal and three significant digits)."""
    if seconds is None:
        return ""
    if math.isnan(seconds):
        return "n/a"
    magnitude = abs(seconds)
    if magnitude < NOISE:
        return "0 s"
    sign = "-" if seconds < 0 else ""
    if math.isinf(magnitude):
        return f"{sign}∞"
    if magnitude < 1.0:
        return f"{sign}{_digits(magnitude * 1000.0, 0, 3)} ms"
    for below, unit_s, unit in _UNITS:
        if magnitude < below:
            return f"{sign}{_digits(magnitude / unit_s, 1, 3)} {unit}"
    return f"{sign}{_digits(magnitude / 86400.0, 1, 3)} d"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 VM type', '2 VM types', '0 VM types' (`nouns`: an irregular plural)."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"
