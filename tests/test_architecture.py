"""The dependency direction of docs/architecture.md, checked on the imports themselves:
policies are pure (no project imports but policies, no I/O modules), drivers know
nothing of the controller or policies, slurm_hooks use the standard library only; the
daemon core never reaches the offline tools or the CLI, and the tools never reach the
scheduler or the API."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECT = {"controller", "drivers", "policies", "slurm_hooks"}


def imports(package: str) -> dict[Path, set[str]]:
    found: dict[Path, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                # Relative imports would hide which package a module reaches into.
                assert node.level == 0, (
                    f"{path}: use absolute imports (from {'.' * node.level}{node.module})"
                )
                names.add(node.module.split(".")[0])
        found[path] = names
    return found


def test_policies_are_pure():
    io_modules = {
        "os",
        "time",
        "sqlite3",
        "sqlite_utils",
        "aiohttp",
        "asyncio",
        "subprocess",
        "socket",
        "requests",
        "urllib",
        "boto3",
        "google",
        "random",
        "pathlib",
        "shutil",
    }
    for path, names in imports("policies").items():
        assert not names & (PROJECT - {"policies"}), f"{path} imports {names & PROJECT}"
        assert not names & io_modules, f"{path} imports {names & io_modules}"


def test_drivers_know_nothing_of_controller_or_policies():
    for path, names in imports("drivers").items():
        assert not names & {"controller", "policies", "slurm_hooks"}, (
            f"{path} imports {names & PROJECT}"
        )


def test_slurm_hooks_use_the_standard_library_only():
    for path, names in imports("slurm_hooks").items():
        outside = {n for n in names if n not in sys.stdlib_module_names and n != "__future__"}
        assert not outside, f"{path} imports {outside}"


def test_sql_lives_only_in_the_store():
    store = REPO / "controller" / "store"
    for path in sorted((REPO / "controller").rglob("*.py")):
        if path.is_relative_to(store):
            continue
        text = path.read_text()
        for keyword in ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM"):
            assert keyword not in text, f"{path} contains SQL ({keyword.strip()})"


# --- the daemon core, the offline tools and the CLI ----------------------------------------

# The CLI: controller/cli/ and the command groups that live with their concern.
CLI = ("controller.cli", "controller.slurm.cli")
CLI_ELSEWHERE = (REPO / "controller" / "slurm" / "cli.py",)
CORE_NEVER = (*CLI, "controller.tools", "click", "rich", "matplotlib")
TOOLS_NEVER = ("controller.scheduler", "controller.api")
# The HTML cost report the API serves draws its charts with matplotlib, imported in the
# function that draws them (the transitive test below shows the daemon does not load it).
LAZY_MATPLOTLIB = {REPO / "controller" / "costs" / "report_render.py"}


def module_names(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (functions too), by its full dotted name;
    `from a import b` counts as both a and a.b (b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def reaches(names: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {n for n in names for f in forbidden if n == f or n.startswith(f + ".")}


def core_modules() -> list[Path]:
    apart = (REPO / "controller" / "cli", REPO / "controller" / "tools", *CLI_ELSEWHERE)
    return [
        p
        for p in sorted((REPO / "controller").rglob("*.py"))
        if not any(p.is_relative_to(d) for d in apart)
    ]


def test_the_daemon_core_never_imports_the_cli_the_tools_or_their_libraries():
    for path in core_modules():
        found = reaches(module_names(path), CORE_NEVER)
        if path in LAZY_MATPLOTLIB:
            found = {n for n in found if not n.startswith("matplotlib")}
        assert not found, f"{path} imports {sorted(found)}"


def test_tools_never_import_the_scheduler_the_api_or_the_cli():
    # Tools compute and raise their own errors; the CLI (click, rich) words and shows them.
    for path in sorted((REPO / "controller" / "tools").rglob("*.py")):
        found = reaches(module_names(path), (*TOOLS_NEVER, *CLI, "click", "rich"))
        assert not found, f"{path} imports {sorted(found)}"


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running `statement`."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


@pytest.mark.processes
def test_the_running_daemon_loads_neither_the_cli_nor_the_tools_nor_their_libraries():
    # click is left out: sqlite-utils (the store's) imports it itself.
    loaded = loaded_after("import controller.daemon")
    found = reaches(loaded, (*CLI, "controller.tools", "rich", "matplotlib"))
    assert not found, f"importing controller.daemon loads {sorted(found)}"


@pytest.mark.processes
def test_the_tools_load_neither_the_scheduler_nor_the_api():
    tools = sorted((REPO / "controller" / "tools").glob("*.py"))
    statement = "\n".join(
        f"import controller.tools.{p.stem}" for p in tools if p.stem != "__init__"
    )
    found = reaches(loaded_after(statement), TOOLS_NEVER)
    assert not found, f"importing the tools loads {sorted(found)}"


@pytest.mark.processes
def test_status_loads_no_analysis_library_and_no_daemon_module():
    # What `spotbag status` imports: the group and its module (it prints plain text).
    loaded = loaded_after("import controller.cli.status")
    heavy = ("scipy", "numpy", "matplotlib", "aiohttp", "pydantic", "sqlite_utils", "rich")
    found = reaches(loaded, (*heavy, "controller.tools", "controller.store", "controller.config"))
    assert not found, f"`spotbag status` loads {sorted(found)}"


@pytest.mark.processes
def test_the_daemon_listens_before_it_loads_the_scheduler_numpy_or_scipy():
    # What `spotbag serve` imports before its socket listens (controller/service.py); the
    # rest is imported on a thread while /healthz answers "starting".
    loaded = loaded_after("import controller.cli.daemon, controller.service")
    later = ("numpy", "scipy", "sqlite_utils", "matplotlib", "controller.daemon")
    found = reaches(
        loaded, (*later, "controller.scheduler", "controller.store", "controller.api.app")
    )
    assert not found, f"`spotbag serve` loads {sorted(found)} before it listens"


@pytest.mark.processes
def test_the_simulator_loads_no_web_server_or_client():
    # `spotbag simulate` runs the scheduler on the sim driver (the local driver's class):
    # aiohttp, which only the daemon's API and the VM hosts' metadata server use, cost a
    # quarter of a second of every simulation.
    loaded = loaded_after("import controller.simulation, drivers.sim")
    found = reaches(loaded, ("aiohttp", "controller.api", "drivers.local_metadata"))
    assert not found, f"`spotbag simulate` loads {sorted(found)}"


def test_every_error_of_the_controller_derives_from_spotbag_error():
    """One root: the API and the CLI map any of spotbag's errors in one place."""
    import importlib
    import inspect
    import pkgutil

    import controller
    from controller.errors import SpotbagError

    outside = []
    for info in pkgutil.walk_packages(controller.__path__, "controller."):
        if info.name.endswith("__main__"):
            continue  # running it would run the CLI
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                cls.__module__ == info.name
                and issubclass(cls, BaseException)
                and not issubclass(cls, SpotbagError)
            ):
                outside.append(f"{info.name}.{name}")
    assert not outside, f"not derived from SpotbagError: {outside}"


def test_the_scheduler_is_composed_not_inherited():
    """The scheduler's parts are collaborators given the World they share (issue 25): no
    class of controller/scheduler/ derives from a project class, only from the standard
    library's (Protocol), so which object defines a method is read off its type."""
    import importlib
    import inspect
    import pkgutil

    import controller.scheduler

    derived = []
    for info in pkgutil.iter_modules(controller.scheduler.__path__, "controller.scheduler."):
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != info.name:
                continue
            project = [
                b.__qualname__ for b in cls.__mro__[1:] if b.__module__.split(".")[0] in PROJECT
            ]
            if project:
                derived.append(f"{info.name}.{name} <- {project}")
    assert not derived, f"scheduler classes deriving from project classes: {derived}"
