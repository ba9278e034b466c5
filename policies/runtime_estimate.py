"""How long a bag's jobs take (docs/design.md#bags, "Runtime estimate").

Jobs of one bag have similar runtimes. Until enough have finished, trust the
bag's hint (`estimated_runtime_s`), else its `max_runtime_s`; afterwards use a
robust statistic of the finished jobs' runtimes. Reuse decisions use a high
quantile (a job that turns out longer than planned is the costly mistake).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def runtime_estimate_s(
    completed_s: Sequence[float],
    hint_s: float | None,
    max_runtime_s: float,
    quantile: float = 0.9,
    min_completed: int = 5,
) -> float:
    """The `quantile` of finished runtimes once `min_completed` have finished, else the
    hint, else the maximum runtime."""
    if len(completed_s) >= min_completed:
        return float(np.quantile(np.asarray(completed_s, dtype=float), quantile))
    return float(hint_s) if hint_s else float(max_runtime_s)
