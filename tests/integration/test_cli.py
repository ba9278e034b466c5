"""The `spotbag` command as users run it, against a real daemon."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from click.testing import CliRunner

from controller.cli import cli
from tests.conftest import REPO, wait_for_bag

pytestmark = pytest.mark.integration


def spotbag(
    *args: str,
    state_dir=None,
    cwd=REPO,
    input_text: str | None = None,
    check: bool = True,
    extra_env: dict | None = None,
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
    env["COLUMNS"] = "200"
    if state_dir is not None:
        env["SPOTBAG_STATE_DIR"] = str(state_dir)
    env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        input=input_text,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"spotbag {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def test_submit_watch_status_jobs_logs(make_daemon, tmp_path):
    daemon = make_daemon()
    daemon.start()
    (tmp_path / "data.txt").write_text("hello from the workdir\n")
    (tmp_path / "bag.yaml").write_text(
        "name: greet\naccount: lab\n"
        "command: 'cat data.txt; echo n={n} word={w}'\n"
        "parameters:\n  n: {range: [0, 3]}\n  w: [alpha, beta gamma]\n"
        "max_runtime_s: 30\n"
    )
    # The CLI finds url and token in the state directory; jobs run in the submitter's directory.
    out = spotbag("submit", "bag.yaml", "--watch", state_dir=daemon.state_dir, cwd=tmp_path)
    assert "submitted bag" in out.stdout and "(6 jobs)" in out.stdout
    assert "succeeded after" in out.stdout and "6 succeeded, 0 failed" in out.stdout
    assert "all VMs" in out.stdout and "saved" in out.stdout
    bag_id = out.stdout.split("submitted bag ")[1].split()[0]

    status = json.loads(spotbag("status", bag_id, "--json", state_dir=daemon.state_dir).stdout)
    assert status["state"] == "succeeded" and status["counts"]["succeeded"] == 6
    listing = spotbag("status", state_dir=daemon.state_dir).stdout
    assert bag_id in listing and "greet" in listing

    jobs = json.loads(
        spotbag("jobs", bag_id, "--json", "--limit", "0", state_dir=daemon.state_dir).stdout
    )
    assert [j["params"] for j in jobs][:2] == [{"n": 0, "w": "alpha"}, {"n": 0, "w": "beta gamma"}]
    table = spotbag("jobs", bag_id, state_dir=daemon.state_dir).stdout
    assert f"{bag_id}-5" in table

    log = spotbag("logs", f"{bag_id}-1", state_dir=daemon.state_dir).stdout
    assert log == "hello from the workdir\nn=0 word=beta gamma\n"
    vms = spotbag("vms", "--all", state_dir=daemon.state_dir).stdout
    assert "local-2" in vms and "VM-hours" in vms


def test_watch_exits_3_when_jobs_fail_and_cancel_works(make_daemon, tmp_path):
    daemon = make_daemon()
    daemon.start()
    spec = {
        "account": "lab",
        "command": "exit {code}",
        "parameters": {"code": [0, 4]},
        "max_runtime_s": 10,
    }
    out = spotbag(
        "submit",
        "-",
        "--watch",
        state_dir=daemon.state_dir,
        input_text=json.dumps(spec),
        check=False,
    )
    assert out.returncode == 3 and "1 succeeded, 1 failed" in out.stdout

    bag_id = spotbag(
        "submit",
        "-",
        "-q",
        state_dir=daemon.state_dir,
        input_text=json.dumps({"account": "lab", "command": "sleep 30", "max_runtime_s": 60}),
    ).stdout.strip()
    out = spotbag("cancel", bag_id, state_dir=daemon.state_dir)
    assert f"cancelling bag {bag_id}" in out.stdout
    assert wait_for_bag(daemon.client(), bag_id, timeout_s=30)["state"] == "cancelled"


def test_errors_are_clear_and_exit_nonzero(make_daemon, tmp_path):
    daemon = make_daemon()
    daemon.start()
    bad = spotbag(
        "submit",
        "-",
        state_dir=daemon.state_dir,
        check=False,
        input_text=json.dumps({"account": "lab", "command": "x {y}", "max_runtime_s": -1}),
    )
    assert bad.returncode == 2
    assert "error: max_runtime_s: Input should be greater than or equal to 1" in bad.stderr
    assert "command: placeholder {y} is not a parameter" in bad.stderr
    wrong = spotbag(
        "status", state_dir=daemon.state_dir, check=False, extra_env={"SPOTBAG_TOKEN": "nope"}
    )
    assert wrong.returncode == 2 and "wrong bearer token" in wrong.stderr
    down = spotbag("--url", "http://127.0.0.1:9", "status", check=False)
    assert (
        down.returncode == 1
        and "cannot reach the spotbag daemon at http://127.0.0.1:9" in down.stderr
    )
    (tmp_path / "broken.yaml").write_text("a: [1,\n")
    broken = spotbag(
        "submit", str(tmp_path / "broken.yaml"), state_dir=daemon.state_dir, check=False
    )
    assert broken.returncode == 2 and "is not valid YAML" in broken.stderr


def test_simulate_prints_the_summary_of_a_real_run(tmp_path):
    (tmp_path / "cfg.toml").write_text(
        "[scheduler]\nmax_vms = 4\n[preemption]\nmodel = 'exponential'\nmttf_h = 3.0\n"
        "[[vm_types]]\nname = 'v4'\ncpus = 4\nmemory_gb = 16\nspot_price_per_hour = 0.04\n"
        "on_demand_price_per_hour = 0.16\n"
    )
    (tmp_path / "bag.yaml").write_text(
        "account: lab\ncommand: run {i}\nparameters: {i: {range: [0, 64]}}\n"
        "max_runtime_s: 7200\nestimated_runtime_s: 1800\nresources: {cpus: 1, memory_gb: 2}\n"
    )
    args = (
        "simulate",
        str(tmp_path / "bag.yaml"),
        "--config",
        str(tmp_path / "cfg.toml"),
        "--seed",
        "4",
    )
    text = spotbag(*args).stdout
    assert "succeeded after" in text and "64 succeeded" in text and "scheduler passes" in text
    first = json.loads(spotbag(*args, "--json").stdout)
    second = json.loads(spotbag(*args, "--json").stdout)
    assert first["bag"]["usage"] == second["bag"]["usage"]
    assert first["bag"]["usage"]["interrupted_attempts"] > 0


def test_config_defaults_and_check(tmp_path):
    text = spotbag("config", "defaults").stdout
    (tmp_path / "c.toml").write_text(text)
    assert "ok" in spotbag("config", "check", str(tmp_path / "c.toml")).stdout
    (tmp_path / "bad.toml").write_text("[scheduler]\nmax_vms = -2\n")
    bad = spotbag("config", "check", str(tmp_path / "bad.toml"), check=False)
    assert bad.returncode == 1 and "scheduler.max_vms" in bad.stderr


def test_yaml_values_follow_yaml_1_2_and_odd_ids_are_quoted(make_daemon, tmp_path):
    daemon = make_daemon()
    daemon.start()
    (tmp_path / "bag.yaml").write_text(
        "account: lab\ncommand: 'echo {lr} {country}'\nmax_runtime_s: 10\n"
        "parameters:\n  lr: [1e-3, 2.5E-4]\n  country: [NO, SE]\n"
    )
    out = spotbag("submit", "bag.yaml", "--watch", state_dir=daemon.state_dir, cwd=tmp_path)
    bag_id = out.stdout.split("submitted bag ")[1].split()[0]
    jobs = json.loads(spotbag("jobs", bag_id, "--json", state_dir=daemon.state_dir).stdout)
    assert [j["params"] for j in jobs] == [
        {"lr": 0.001, "country": "NO"},
        {"lr": 0.001, "country": "SE"},
        {"lr": 0.00025, "country": "NO"},
        {"lr": 0.00025, "country": "SE"},
    ]
    for odd in ("x?y", "a/b", "b123 456"):
        result = spotbag("status", odd, state_dir=daemon.state_dir, check=False)
        assert result.returncode == 2 and f"bag {odd!r} does not exist" in result.stderr
    missing = spotbag("submit", "nope.yaml", state_dir=daemon.state_dir, check=False)
    assert missing.returncode == 2 and "nope.yaml does not exist" in missing.stderr
    (tmp_path / "latin1.yaml").write_bytes("account: caf\xe9\n".encode("latin-1"))
    latin = spotbag(
        "submit", str(tmp_path / "latin1.yaml"), state_dir=daemon.state_dir, check=False
    )
    assert latin.returncode == 2 and "is not UTF-8 text" in latin.stderr


def test_logs_follow_a_job_through_its_retries(make_daemon, tmp_path):
    daemon = make_daemon()
    daemon.start()
    # The first attempt fails with a retryable code, the second succeeds.
    spec = {
        "account": "lab",
        "max_runtime_s": 30,
        "retryable_exit_codes": [75],
        # The first attempt lasts long enough that `logs --follow` (which starts with
        # the latest attempt) surely starts during it, even on a loaded machine.
        "command": 'echo "attempt $SPOTBAG_ATTEMPT"; if [ "$SPOTBAG_ATTEMPT" = 1 ]; then '
        "sleep 4; exit 75; fi; sleep 1",
    }
    bag_id = spotbag(
        "submit", "-", "-q", state_dir=daemon.state_dir, input_text=json.dumps(spec)
    ).stdout.strip()
    followed = spotbag("logs", f"{bag_id}-0", "--follow", state_dir=daemon.state_dir)
    assert followed.stdout == "attempt 1\nattempt 2\n"
    assert "--- attempt 2 ---" in followed.stderr


def write_lifetimes(path, n=400, seed=3):
    """A lifetimes CSV in the format of the shipped lifetimes (controller/data/reference/), from a known bathtub."""
    import csv

    import numpy as np

    from policies.preemption import Bathtub

    rng = np.random.default_rng(seed)
    truth = Bathtub(A=0.4, tau1=1.5, tau2=1.0, b=25.0, L=24.0)
    lives, stops = truth.sample_h(rng, n), rng.exponential(15.0, n)
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(
            [
                "name",
                "machine_type",
                "zone",
                "insert_time",
                "end_time",
                "lifetime_s",
                "event",
                "idle",
            ]
        )
        for i, (life, stop) in enumerate(zip(lives, stops, strict=True)):
            kind = "n1-highcpu-16" if i % 2 else "n1-highcpu-4"
            out.writerow(
                [
                    f"vm{i}",
                    kind,
                    "us-east1-b",
                    "2019-03-25T12:00:00-07:00",
                    "",
                    min(life, stop) * 3600,
                    "preempted" if life <= stop else "stop",
                    "non-idle",
                ]
            )


def test_fit_prints_every_model_per_group_and_writes_plot_and_registry(tmp_path):
    data = tmp_path / "lifetimes.csv"
    write_lifetimes(data)

    # In this process: the command's process is what the tests above are about.
    def fit(*args: str, code: int = 0):
        result = CliRunner().invoke(cli, ["fit", *args])
        assert result.exit_code == code, result.output
        return result

    table = fit(str(data), "--by", "machine_type").stdout
    for group in ("machine_type=n1-highcpu-16", "machine_type=n1-highcpu-4"):
        assert group in table
    for model in ("bathtub", "exponential", "weibull", "gompertz_makeham"):
        assert table.count(model) == 2
    fits = json.loads(fit(str(data), "--json", "--method", "lsq").stdout)
    assert len(fits) == 1 and fits[0]["n"] == 400
    assert set(fits[0]["fits"]) == {"bathtub", "exponential", "weibull", "gompertz_makeham"}
    assert fits[0]["fits"]["bathtub"]["method"] == "lsq"
    plot, registry = tmp_path / "fits.png", tmp_path / "registry.json"
    fit(str(data), "--plot", str(plot), "--registry", str(registry), "--min-samples", "100")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from controller.preemption.model_book import load_registry

    loaded = load_registry(str(registry))
    assert loaded.lookup("gce", "n1-highcpu-16", "us-east1-b").key.vm_type == "n1-highcpu-16"
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "name,machine_type,zone,insert_time,lifetime_s,event\nx,t,z,2019-01-01T00:00:00,-5,preempted\n"
    )
    failed = fit(str(bad), code=1)
    assert "bad.csv:2: lifetime_s must be >= 0" in failed.stderr


def test_a_yaml_bomb_is_refused_by_the_cli_in_under_2_cpu_seconds(make_daemon, tmp_path):
    # Issue 23: 500 bytes of nested aliases ("billion laughs", 9 levels of 9) kept
    # `spotbag submit` and `simulate` expanding them for minutes.
    daemon = make_daemon()
    client = daemon.start()
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 9)]
    lines += ["account: lab", "command: echo {x}", "max_runtime_s: 60", "parameters: {x: *l8}"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 600  # the "500-byte YAML file"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
    env.update(COLUMNS="200", SPOTBAG_STATE_DIR=str(daemon.state_dir))
    for command in ("submit", "simulate"):
        # CPU time, not wall time: on a busy host the wall clock says more about the
        # other processes (the expansion took minutes of CPU).
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run(
            [sys.executable, "-m", "controller.cli", command, "bomb.yaml"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=30,  # the expansion took minutes: fail fast, not hang
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        took = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert result.stderr == (
            "error: bomb.yaml: its YAML aliases (*name) would expand it to more than 64 MB of "
            "JSON, larger than any bag the API takes (refused before expanding it)\n"
        ), result.stderr
        assert took < 2.0, (command, took)  # CPU seconds, Python's start included
    assert client.bags() == []  # nothing reached the daemon
