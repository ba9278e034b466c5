"""A figure's target beside it, so `make bench` shows at a glance what meets its target
(the targets are the issues' and bench/README.md's)."""


def against(value: float, limit: float, unit: str, *, at_least: bool = False) -> str:
    """`(target <= 3 s: ok)`, or `OVER TARGET` / `UNDER TARGET` when `value` misses it."""
    if at_least:
        verdict = "ok" if value >= limit else "UNDER TARGET"
        return f"(target >= {limit:g} {unit}: {verdict})"
    verdict = "ok" if value <= limit else "OVER TARGET"
    return f"(target <= {limit:g} {unit}: {verdict})"
