"""Cost reports end to end: a real daemon runs a bag on local VMs; the report over HTTP
and through the CLI (table, JSON, CSV, one-file HTML) agrees with the VMs it used, and
an account token sees only its own account's reports."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time

import pytest

from controller.cli.client import ClientError
from tests.conftest import wait_for_bag, wait_until
from tests.integration.test_cli import spotbag

pytestmark = pytest.mark.integration


def test_reports_over_http_and_the_cli(make_daemon, tmp_path):
    daemon = make_daemon()
    admin = daemon.start()
    admin.create_account("lab", cpu_hours=100)
    admin.create_account("other", cpu_hours=100)
    spec = {"command": "sleep 0.3", "parameters": {"i": list(range(6))}, "max_runtime_s": 60}
    ours = admin.submit(dict(spec, account="lab"))
    theirs = admin.submit(dict(spec, account="other"))
    for bag in (ours, theirs):
        assert wait_for_bag(admin, bag["id"], 60)["state"] == "succeeded"

    report = admin.report(bag=ours["id"])
    totals = report["totals"]
    assert report["scope"] == {"bag": ours["id"]}
    assert totals["attempts"] == 6 and totals["preemptions"] == 0
    assert totals["vm_h"] > 0 and totals["spot_cost_usd"] > 0
    assert totals["on_demand_cost_usd"] > totals["spot_cost_usd"]
    assert totals["cpu_h"] == pytest.approx(admin.account("lab")["charged_cpu_h"], rel=1e-9)
    used = {vm["id"] for vm in report["vms"]}
    assert used and used <= {vm["id"] for vm in admin.vms(include_ended=True)["vms"]}

    table = spotbag("report", "--bag", ours["id"], state_dir=daemon.state_dir).stdout
    assert "Cost report: bag " + ours["id"] in table and "total" in table
    out = tmp_path / "lab.html"
    spotbag(
        "report", "--account", "lab", "--format", "html", "-o", str(out), state_dir=daemon.state_dir
    )
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and ours["id"] in page
    rows = list(
        csv.DictReader(
            io.StringIO(
                spotbag(
                    "report", "--account", "lab", "--format", "csv", state_dir=daemon.state_dir
                ).stdout
            )
        )
    )
    assert rows[0]["section"] == "total" and rows[-1]["key"] == ours["id"]
    as_json = json.loads(
        spotbag(
            "report", "--bag", ours["id"], "--format", "json", state_dir=daemon.state_dir
        ).stdout
    )
    assert as_json["totals"]["attempts"] == 6

    # Refusals: one scope exactly; unknown scope; another account's report.
    both = spotbag("report", state_dir=daemon.state_dir, check=False)
    assert both.returncode == 2 and "one of --bag or --account" in both.stderr
    with pytest.raises(ClientError) as caught:
        admin.report(bag=ours["id"], account="lab")
    assert caught.value.status == 400
    with pytest.raises(ClientError) as caught:
        admin.report(account="nobody")
    assert caught.value.status == 404 and "nothing to report" in caught.value.message
    token = admin.create_token("lab")["token"]
    lab = daemon.client(token)
    assert lab.report(account="lab")["totals"]["attempts"] == 6
    with pytest.raises(ClientError) as caught:
        lab.report(account="other")
    assert caught.value.status == 403
    with pytest.raises(ClientError) as caught:
        lab.report(bag=theirs["id"])
    assert caught.value.status == 404


def test_a_bags_cost_is_its_reports_also_after_a_restart(make_daemon):
    """Two bags whose jobs reserve unequal parts of one VM: GET /v1/bags/{id} shows the
    cost its report splits (docs/design.md#cost-reports), and the same after a restart."""
    daemon = make_daemon(max_vms=1)
    admin = daemon.start()
    admin.create_account("lab", cpu_hours=100)
    base = {"account": "lab", "command": "sleep 1", "max_runtime_s": 60}
    on_one_vm = {"vm_types": ["local-4"]}  # 4 CPUs, 8 GB: room for both bags' jobs at once
    small = admin.submit(
        dict(base, parameters={"i": [0, 1]}, resources={"cpus": 1, "memory_gb": 1, **on_one_vm})
    )
    large = admin.submit(
        dict(base, parameters={"i": [0]}, resources={"cpus": 2, "memory_gb": 4, **on_one_vm})
    )
    bag_ids = [small["id"], large["id"]]
    for bag_id in bag_ids:
        assert wait_for_bag(admin, bag_id, 60)["state"] == "succeeded"
    # The VM is released after its idle timeout; from then on the costs are final.
    vms = wait_until(
        lambda: [vm for vm in admin.vms(include_ended=True)["vms"] if vm["ended_at"]],
        30,
        what="the VM to end",
    )
    assert len(vms) == 1
    (vm,) = vms
    views = {bag_id: admin.bag(bag_id)["usage"] for bag_id in bag_ids}
    for bag_id, usage in views.items():
        report = admin.report(bag=bag_id)
        assert [v["id"] for v in report["vms"]] == [vm["id"]]  # the VM both bags shared
        totals = report["totals"]
        assert usage["cost_final"]
        assert usage["vm_hours"] == pytest.approx(totals["vm_h"], rel=1e-12)
        assert usage["spot_cost_usd"] == pytest.approx(totals["spot_cost_usd"], rel=1e-12)
        assert usage["on_demand_cost_usd"] == pytest.approx(totals["on_demand_cost_usd"], rel=1e-12)
    # Between them the two bags paid the VM's whole life, unequally (unequal reservations).
    life_h = (vm["ended_at"] - vm["running_at"]) / 3600.0
    assert sum(u["vm_hours"] for u in views.values()) == pytest.approx(life_h, rel=1e-9)
    assert sum(u["spot_cost_usd"] for u in views.values()) == pytest.approx(
        life_h * vm["spot_price_per_hour"], rel=1e-9
    )
    assert views[small["id"]]["spot_cost_usd"] != pytest.approx(views[large["id"]]["spot_cost_usd"])
    assert {b["id"]: b["usage"]["spot_cost_usd"] for b in admin.bags()} == {
        bag_id: usage["spot_cost_usd"] for bag_id, usage in views.items()
    }

    assert daemon.stop() == 0
    admin = daemon.start()
    for bag_id, usage in views.items():
        again = admin.bag(bag_id)["usage"]
        for key in ("vm_hours", "spot_cost_usd", "on_demand_cost_usd", "savings_usd", "cost_final"):
            assert again[key] == usage[key]  # restored exactly: the same rows, the same split


def test_the_fleet_over_http_costs_what_the_report_says_under_sampled_prices(make_daemon):
    """GET /v1/vms prices each VM as reports do: spot prices recorded (unlike the
    configured ones) while a bag runs alone on its VMs; once they ended, each VM's
    cost, the fleet total, the bag's report and the bag's view all agree, and none is
    the configured price × the billed hours."""
    daemon = make_daemon(max_vms=2)
    admin = daemon.start()
    admin.create_account("lab", cpu_hours=100)
    now = time.time()
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        conn.executemany(
            "INSERT OR REPLACE INTO price_samples (vm_type, zone, at, price_per_hour) "
            "VALUES (?, ?, ?, ?)",
            [
                (vm_type, "local", at, price)
                for vm_type in ("local-2", "local-4")
                for at, price in ((now, 0.9), (now + 1.5, 0.3))
            ],
        )
    spec = {"command": "sleep 1", "parameters": {"i": list(range(4))}, "max_runtime_s": 60}
    bag = admin.submit(dict(spec, account="lab"))
    assert wait_for_bag(admin, bag["id"], 60)["state"] == "succeeded"
    wait_until(lambda: not admin.vms()["vms"], 30, 0.2, "the VMs to end")
    ended = max(vm["ended_at"] for vm in admin.vms(include_ended=True)["vms"])
    fleet = wait_until(
        lambda: (f := admin.vms(include_ended=True))["usage"]["cost_as_of"] >= ended and f,
        30,
        0.2,
        "the fleet's cost after the VMs ended",
    )
    vms, total = fleet["vms"], fleet["usage"]["total"]
    totals = admin.report(bag=bag["id"])["totals"]
    view = admin.bag(bag["id"])["usage"]
    assert view["cost_final"]
    assert total["vms"] == totals["vms"] == len(vms)
    assert total["spot_cost_usd"] == pytest.approx(totals["spot_cost_usd"], rel=1e-9)
    assert total["vm_hours"] == pytest.approx(totals["vm_h"], rel=1e-9)
    assert sum(vm["cost_usd"] for vm in vms) == pytest.approx(totals["spot_cost_usd"], rel=1e-9)
    # The bag alone on its VMs costs what the fleet cost.
    assert view["spot_cost_usd"] == pytest.approx(total["spot_cost_usd"], rel=1e-9)
    assert view["vm_hours"] == pytest.approx(total["vm_hours"], rel=1e-9)
    configured = sum(vm["billed_hours"] * vm["spot_price_per_hour"] for vm in vms)
    assert total["spot_cost_usd"] > 5 * configured
