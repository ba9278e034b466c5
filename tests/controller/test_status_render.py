"""What `spotbag status` prints for a bag with a deadline and a budget: the deadline's
projection (the API's `deadline`, filled by the deadline policy), budget used against
the caps, and the list's flag; robust to a daemon that sends no `deadline` at all."""

from __future__ import annotations

import copy
import re
from typing import Any

from controller.cli.render import bag_table, deadline_lines, render_summary, when

CREATED = 1_790_000_000.0
ELAPSED_S = 7200.0
NOW = CREATED + ELAPSED_S


def a_bag(**extra: Any) -> dict[str, Any]:
    """GET /v1/bags/{id} of an active bag with a deadline 10 h after its submission and a
    $40 budget, as the daemon answers it (without the `deadline` field unless given)."""
    bag: dict[str, Any] = {
        "id": "b7f3a9",
        "name": "sweep",
        "account": "lab",
        "state": "active",
        "cancel_requested": False,
        "created_at": CREATED,
        "finished_at": None,
        "elapsed_s": ELAPSED_S,
        "job_count": 1000,
        "counts": {
            "queued": 700,
            "held": 0,
            "running": 50,
            "succeeded": 240,
            "failed": 10,
            "cancelled": 0,
        },
        "progress": 0.25,
        "usage": {
            "attempts": 310,
            "interrupted_attempts": 12,
            "attempt_hours": 400.0,
            "preempted_attempt_hours": 6.0,
            "lost_hours": 1.5,
            "checkpoints": 30,
            "checkpoint_hours": 0.2,
            "vm_hours": 110.0,
            "spot_cost_usd": 12.5,
            "on_demand_cost_usd": 41.0,
            "savings_usd": 28.5,
            "cost_as_of": NOW,
            "cost_final": False,
        },
        "pace": None,
        "options": {
            "deadline": "10h",
            "deadline_at": CREATED + 36000.0,
            "on_demand": "when_needed",
            "deadline_confidence": 0.95,
            "budget_usd": 40.0,
            "notify": [],
        },
        "budget": {
            "budget_usd": 40.0,
            "charged_usd": 12.5,
            "reserved_usd": 3.5,
            "account_budget_usd": 500.0,
            "account_month_charged_usd": 123.45,
            "held": None,
        },
    }
    bag.update(extra)
    return bag


PROJECTED = {
    "at": CREATED + 36000.0,
    "confidence": 0.95,
    "p_meet": 0.9712,
    "finish": {"p50": NOW + 5 * 3600.0, "p90": NOW + 6 * 3600.0, "p95": NOW + 6.5 * 3600.0},
    "at_risk": False,
    "on_demand_slots": 8,
    "on_demand_share": 0.0004,
}


def test_a_projected_deadline_prints_its_finish_spread_chance_and_on_demand_share():
    text = render_summary(a_bag(deadline=PROJECTED))
    lines = text.splitlines()
    assert f"  deadline    {when(CREATED + 36000.0)} (10h), on-demand when_needed" in text
    assert "  time left   8.0 h" in lines  # 10 h after submission, 2 h elapsed
    projected = [line for line in lines if line.startswith("  projected")]
    assert projected == [
        f"  projected   finish {when(NOW + 18000.0)} (p50), {when(NOW + 21600.0)} – "
        f"{when(NOW + 23400.0)} (p90 – p95); meets the deadline with p = 97.1 %"
    ]
    # A tiny share is not rounded to 0 (controller/formatting.py).
    assert "  on-demand   8 slots now, on-demand share so far 0.04 %" in lines
    assert "AT RISK" not in text
    # Budget used against both caps: $16 of $40 is 40 %.
    assert (
        "  budget      $12.50 charged + $3.50 reserved of $40.00 (40 % used)"
        " (account: $123.45 of $500.00 this month)"
    ) in lines


def test_an_at_risk_deadline_says_so_and_a_missed_one_says_how_long_ago():
    late = copy.deepcopy(PROJECTED)
    late.update(at=NOW - 90.0, at_risk=True, p_meet=0.0)
    lines = render_summary(a_bag(deadline=late)).splitlines()
    assert "  time left   passed 1.5 min ago" in lines
    assert "  AT RISK     the projection may miss the deadline" in lines
    assert any(line.endswith("meets the deadline with p = 0 %") for line in lines)


def test_a_deadline_not_yet_projected_or_absent_prints_what_is_known():
    unprojected = {**PROJECTED, "p_meet": None, "finish": None, "on_demand_share": None}
    lines = deadline_lines(unprojected, a_bag())
    assert lines == [
        "  time left   8.0 h",
        "  projected   not yet (too few jobs have ended)",
        "  on-demand   8 slots now",
    ]
    # A daemon without the deadline policy: no `deadline` field, or null.
    for bag in (a_bag(), a_bag(deadline=None)):
        text = render_summary(bag)
        assert "projected" not in text and "time left" not in text
        assert "  deadline    " in text
    # An ended bag has no time left to show.
    ended = a_bag(state="succeeded", deadline=PROJECTED)
    assert not any("time left" in line for line in render_summary(ended).splitlines())


def test_the_list_flags_bags_at_risk_or_held_by_a_budget():
    held = a_bag(id="b1", budget={**a_bag()["budget"], "held": "held: budget: bag b1: ..."})
    risky = a_bag(id="b2", deadline={**PROJECTED, "at_risk": True})
    both = a_bag(id="b3", deadline={**PROJECTED, "at_risk": True}, budget=held["budget"])
    plain = a_bag(id="b4")
    del plain["budget"]  # an ended bag in a list comes without its budget
    header, *rows = str(bag_table([held, risky, both, plain])).splitlines()
    assert header.split()[-1] == "flag"
    # The last cells, columns two or more spaces apart: the spot cost, then the flag.
    assert [re.split(r" {2,}", row)[-2:] for row in rows] == [
        ["$12.50", "held: budget"],
        ["$12.50", "AT RISK"],
        ["$12.50", "AT RISK, held: budget"],
        ["12", "$12.50"],  # no flag: the row ends at the cost
    ]
