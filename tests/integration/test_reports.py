"""Cost reports end to end: a real daemon runs a bag on local VMs; the report over HTTP
and through the CLI (table, JSON, CSV, one-file HTML) agrees with the VMs it used, and
an account token sees only its own account's reports."""

from __future__ import annotations

import csv
import io
import json

import pytest

from controller.cli.client import ClientError
from tests.conftest import wait_for_bag
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
