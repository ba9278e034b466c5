"""How long a bag's jobs take (docs/design.md#bags, "Runtime estimate").

Jobs of one bag have similar runtimes. Until enough have finished, trust the
bag's hint (`estimated_runtime_s`), else its `max_runtime_s`; afterwards use a
robust statistic of the finished jobs' runtimes. Reuse decisions use a high
quantile (a job that turns out longer than planned is the costly mistake).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def runtime_estimate_s(
    completed_s: Sequence[float],
    hint_s: float | None,
    max_runtime_s: float,
    quantile: float = 0.9,
    min_completed: int = 5,
    *,
    ascending: bool = False,
) -> float:
    """The `quantile` of finished runtimes once `min_completed` have finished, else the
    hint, else the maximum runtime. `ascending`: `completed_s` is sorted already."""
    if len(completed_s) >= min_completed:
        return quantile_of_sorted(completed_s if ascending else sorted(completed_s), quantile)
    return float(hint_s) if hint_s else float(max_runtime_s)


def quantile_of_sorted(values: Sequence[float], quantile: float) -> float:
    """The `quantile` of ascending `values` (not empty, no NaN), interpolated linearly
    between order statistics: Hyndman & Fan's definition 7, numpy.quantile's default
    ("linear"), computed with numpy's very operations so that it is the same to the
    last bit: the index (n - 1) q, and its lerp, which takes b - (b - a)(1 - g) when
    g >= 0.5 (numpy.lib._function_base_impl._lerp). In pure Python: numpy's call
    overhead and the copy of the values cost 10-20 x this on 1,000 values."""
    n = len(values)
    virtual = (n - 1) * quantile
    if virtual >= n - 1:
        return float(values[-1])
    below = math.floor(virtual)
    a, b = float(values[below]), float(values[below + 1])
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
