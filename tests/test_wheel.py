"""What a user installs works: the sdist and the wheel build, and the wheel, installed
into a virtualenv outside the repository, runs `spotbag --version`, `spotbag config
defaults`, `spotbag serve` (local driver; /healthz answers, SIGTERM stops it) and `spotbag
fit` on the shipped data, and finds its package data: the shipped preemption models,
the bootstrap template, the hook program, the web UI and the reference data.

The build is `python -m build` (sdist, then the wheel from that sdist, so the sdist is
complete too), or `pip wheel` where `build` is not installed (the dev extras have it);
either fetches setuptools into an isolated build environment. The virtualenv gets
spotbag from the wheel only; its dependencies (numpy, scipy, aiohttp, ...) come from
this interpreter's site-packages through a .pth line, so the test runs offline and in
seconds. A .pth line adds a directory but runs none of its .pth files, so a development
install of spotbag there (an editable finder) stays out; the test checks that spotbag's
modules and data are loaded from the virtualenv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path
from unittest.mock import ANY

import pytest

from controller import __version__
from tests.conftest import REPO, wait_until_ready

pytestmark = pytest.mark.processes

# What the wheel must hold besides modules (pyproject's package-data).
PACKAGE_DATA = (
    "controller/data/preemption_models.json",
    "controller/data/ec2_instance_types.json",
    "controller/data/reference/README.md",
    "controller/data/reference/goog-preemption/lifetimes.csv",
    "controller/data/reference/spot-prices/us-east-1_spot_2015-03_to_2015-08.csv.gz",
    "controller/data/reference/hpc-traces/DOST-ASTI_COARE-Saliksik-2020-cln.swf.gz",
    "controller/web/static/style.css",
    "drivers/templates/node_join.sh",
    "drivers/templates/notice_watch.py",
    "drivers/data/aws_on_demand.json",
    "slurm_hooks/spotbag_hook.py",
)
# Not part of a checkout's source: left out of the copy the build starts from.
UNSHIPPED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
UNSHIPPED += (".hypothesis", "artifacts", "state")

# Run inside the virtualenv: where spotbag's code and data come from.
PROBE = """
import json, controller, drivers.bootstrap
from controller.preemption.model_book import load_registry
from controller.traces.reference_data import DATASETS, REFERENCE_DIR
from controller.slurm.hooks_install import hook_program
registry = load_registry()
script = drivers.bootstrap.render(None, {"SPOTBAG_VM_ID": "vm-1"})
print(json.dumps({
    "controller": controller.__file__,
    "models": len(registry.entries),
    "boot_script": "slurmd" in script and "vm-1" in script,
    "hook_program": "def main" in hook_program(),
    "reference": str(REFERENCE_DIR),
    "datasets": {name: d.path.stat().st_size for name, d in DATASETS.items()},
}))
"""


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout_s: float = 600) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from a copy of the checkout."""
    work = tmp_path_factory.mktemp("build")
    source = work / "spotbag"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*UNSHIPPED))
    out = work / "dist"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if importlib.util.find_spec("build") is not None:
        run(sys.executable, "-m", "build", "--outdir", out, source, cwd=work, env=env)
        assert len(list(out.glob("spotbag-*.tar.gz"))) == 1
    else:
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, source, cwd=work, env=env)
    return out


def test_the_wheel_holds_the_package_data_and_no_tests(dists):
    wheel = next(dists.glob(f"spotbag-{__version__}-py3-none-any.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [path for path in PACKAGE_DATA if path not in names]
    tops = {name.split("/")[0] for name in names if not name.startswith("spotbag-")}
    assert tops == {"controller", "drivers", "policies", "slurm_hooks"}
    metadata = zipfile.ZipFile(wheel).read(f"spotbag-{__version__}.dist-info/entry_points.txt")
    assert b"spotbag = controller.cli:main" in metadata
    # The reference data is what the checkout ships, byte for byte.
    for name in names:
        if name.startswith("controller/data/reference/"):
            assert zipfile.ZipFile(wheel).read(name) == (REPO / name).read_bytes()


def test_the_installed_wheel_works_outside_the_repository(dists, tmp_path):
    wheel = next(dists.glob("spotbag-*.whl"))
    venv = tmp_path / "venv"
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SPOTBAG")}
    env.update(HOME=str(home), COLUMNS="200")
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=env)
    python, spotbag = venv / "bin" / "python", venv / "bin" / "spotbag"
    site = Path(
        run(
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            cwd=tmp_path,
            env=env,
        ).strip()
    )
    (site / "spotbag_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-index",
        "--ignore-installed",
        wheel,
        cwd=tmp_path,
        env=env,
    )

    assert run(spotbag, "--version", cwd=home, env=env).strip() == f"spotbag, version {__version__}"
    defaults = run(spotbag, "config", "defaults", cwd=home, env=env)
    assert "[driver]" in defaults and "[[vm_types]]" in defaults

    probe = json.loads(run(python, "-c", PROBE, cwd=home, env=env))
    assert Path(probe["controller"]).is_relative_to(site), probe
    assert Path(probe["reference"]).is_relative_to(site), probe
    assert probe["models"] >= 50 and probe["boot_script"] and probe["hook_program"]
    shipped = {"lifetimes": 174_689, "spot-prices": 1_660_078, "swf": 213_688}
    assert probe["datasets"] == shipped
    assert (
        run(spotbag, "data", "path", "lifetimes", cwd=home, env=env).strip().startswith(str(site))
    )

    fitted = run(
        spotbag,
        "fit",
        run(spotbag, "data", "path", "lifetimes", cwd=home, env=env).strip(),
        "--by",
        "machine_type",
        "--json",
        cwd=home,
        env=env,
    )
    assert "n1-highcpu-16" in fitted and "bathtub" in fitted

    state = tmp_path / "state"
    config = tmp_path / "spotbag.toml"
    config.write_text('[api]\nport = 0\n\n[driver]\nname = "local"\n')
    serve_env = {**env, "SPOTBAG_STATE_DIR": str(state)}
    daemon = subprocess.Popen(
        [spotbag, "serve", "--config", config],
        cwd=home,
        env=serve_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def output() -> str:  # what it printed, once it has exited (before, a read would wait)
        return daemon.stdout.read() if daemon.stdout and daemon.poll() is not None else ""

    try:
        url = wait_until_ready(state, daemon, output)
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            assert r.status == 200
            assert json.loads(r.read()) == {
                "ok": True,
                "status": "ok",
                "driver": "local",
                "schema_version": ANY,
            }
        # The CLI finds the daemon through its state directory, as on a head node.
        assert "no bags" in run(spotbag, "status", cwd=home, env=serve_env)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.stdout.read() if daemon.stdout else ""
    finally:
        if daemon.poll() is None:
            daemon.kill()
