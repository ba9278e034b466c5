"""The dependency direction of ARCHITECTURE.md, checked on the imports themselves:
policies are pure (no project imports but policies, no I/O modules), drivers know
nothing of the controller or policies, slurm_hooks use the standard library only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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
