"""vCPUs and memory of cloud VM types by name, for the offline tools whose traces name
types only (`spotbag index`, `spotbag simulate-hopping`).

A size is looked up, first match wins, in

1. a `--types FILE` (`read_sizes_file`): CSV with a header row name,vcpus,memory_gb
   (gpus optional), or JSON, a list of such objects or {name: {vcpus, memory_gb}};
2. a config's catalog (`catalog_sizes`): each [[vm_types]] entry under its name and
   its instance_type;
3. the bundled table (`bundled_sizes`): every EC2 type, current and previous
   generation, from controller/data/ec2_instance_types.json (generated from moto's
   Apache-2.0 instance type data by controller/data/make_ec2_instance_types.py), and
   the common predefined GCE machine types, generated here from Google's documented
   memory per vCPU (`gce_sizes`).

Memory is in GB as the clouds state it (EC2's GiB).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from controller.traces.trace_io import TraceError, csv_records, open_text

EC2_TABLE = "data/ec2_instance_types.json"
WAYS_TO_SIZE = (
    "give its size with --types FILE (CSV or JSON: name, vcpus, memory_gb) or with "
    "--config FILE (a [[vm_types]] entry of that name or instance_type, with cpus and "
    "memory_gb)"
)


@dataclass(frozen=True)
class VmSize:
    vcpus: float
    memory_gb: float
    gpus: int = 0


class UnknownVmSizeError(TraceError):
    """Types no table knows; the message says how to supply their sizes."""


# --- GCE -----------------------------------------------------------------------------

# family -> kind -> (GB per vCPU, vCPU counts): Google's machine families pages
# (cloud.google.com/compute/docs/general-purpose-machines, compute-optimized-machines).
_GCE_FAMILIES: dict[str, dict[str, tuple[float, tuple[int, ...]]]] = {
    "e2": {
        "standard": (4.0, (2, 4, 8, 16, 32)),
        "highmem": (8.0, (2, 4, 8, 16)),
        "highcpu": (1.0, (2, 4, 8, 16, 32)),
    },
    "n1": {
        "standard": (3.75, (1, 2, 4, 8, 16, 32, 64, 96)),
        "highmem": (6.5, (2, 4, 8, 16, 32, 64, 96)),
        "highcpu": (0.9, (2, 4, 8, 16, 32, 64, 96)),
    },
    "n2": {
        "standard": (4.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        "highmem": (8.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        "highcpu": (1.0, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
    },
    "n2d": {
        "standard": (4.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
        "highmem": (8.0, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
        "highcpu": (1.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
    },
    "c2": {"standard": (4.0, (4, 8, 16, 30, 60))},
    "c2d": {
        "standard": (4.0, (2, 4, 8, 16, 32, 56, 112)),
        "highmem": (8.0, (2, 4, 8, 16, 32, 56, 112)),
        "highcpu": (2.0, (2, 4, 8, 16, 32, 56, 112)),
    },
    "c3": {
        "standard": (4.0, (4, 8, 22, 44, 88, 176)),
        "highmem": (8.0, (4, 8, 22, 44, 88, 176)),
        "highcpu": (2.0, (4, 8, 22, 44, 88, 176)),
    },
    "t2d": {"standard": (4.0, (1, 2, 4, 8, 16, 32, 48, 60))},
}
# Types off their family's ratio, the shared-core types and the memory-optimized ones.
_GCE_LISTED: dict[str, tuple[float, float]] = {
    "n2-highmem-128": (128, 864.0),
    "e2-micro": (2, 1.0),
    "e2-small": (2, 2.0),
    "e2-medium": (2, 4.0),
    "f1-micro": (1, 0.6),
    "g1-small": (1, 1.7),
    "m1-ultramem-40": (40, 961.0),
    "m1-ultramem-80": (80, 1922.0),
    "m1-ultramem-160": (160, 3844.0),
    "m1-megamem-96": (96, 1433.6),
    "m2-ultramem-208": (208, 5888.0),
    "m2-ultramem-416": (416, 11776.0),
    "m2-megamem-416": (416, 5888.0),
    "m2-hypermem-416": (416, 8832.0),
}


@cache
def gce_sizes() -> dict[str, VmSize]:
    """The common predefined GCE machine types: family-kind-vCPUs with the kind's
    memory per vCPU, plus the listed exceptions."""
    sizes = {
        f"{family}-{kind}-{vcpus}": VmSize(vcpus, round(gb_per_vcpu * vcpus, 3))
        for family, kinds in _GCE_FAMILIES.items()
        for kind, (gb_per_vcpu, counts) in kinds.items()
        for vcpus in counts
    }
    sizes.update({name: VmSize(v, gb) for name, (v, gb) in _GCE_LISTED.items()})
    return sizes


# --- EC2 and the bundled table -------------------------------------------------------


@cache
def ec2_sizes() -> dict[str, VmSize]:
    """Every EC2 instance type from the bundled table."""
    text = resources.files("controller").joinpath(EC2_TABLE).read_text(encoding="utf-8")
    return {name: VmSize(*row) for name, row in json.loads(text)["types"].items()}


def bundled_sizes() -> dict[str, VmSize]:
    return ec2_sizes() | gce_sizes()


# --- a user's sizes ------------------------------------------------------------------


def _size(entry: Mapping[str, Any], where: str) -> VmSize:
    vcpus = entry.get("vcpus", entry.get("cpus"))
    values = {"vcpus": vcpus, "memory_gb": entry.get("memory_gb"), "gpus": entry.get("gpus", 0)}
    numbers = {}
    for key, value in values.items():
        try:
            number = float(value if value not in ("", None) else "nan")
        except (TypeError, ValueError):
            number = math.nan
        low_ok = number >= 0 if key == "gpus" else number > 0
        if not (math.isfinite(number) and low_ok):
            need = "a whole number >= 0" if key == "gpus" else "a number > 0"
            raise TraceError(f"{where}: {key} must be {need}, not {value!r}")
        numbers[key] = number
    if numbers["gpus"] != int(numbers["gpus"]):
        raise TraceError(f"{where}: gpus must be a whole number, not {values['gpus']!r}")
    return VmSize(numbers["vcpus"], numbers["memory_gb"], int(numbers["gpus"]))


def _add(sizes: dict[str, VmSize], name: Any, size: VmSize, where: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise TraceError(f"{where}: a type needs a name")
    if name.strip() in sizes:
        raise TraceError(f"{where}: {name.strip()!r} is given twice")
    sizes[name.strip()] = size


def read_sizes_file(path: str | Path) -> dict[str, VmSize]:
    """Sizes from a CSV (header: name, vcpus, memory_gb[, gpus]) or JSON file (a list
    of {name, vcpus, memory_gb} or {name: {vcpus, memory_gb}}), gzip or not."""
    path = Path(path)
    with open_text(path) as handle:
        text = handle.read()
    sizes: dict[str, VmSize] = {}
    if text.lstrip()[:1] in ("[", "{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        if isinstance(data, dict):
            data = [{"name": name, **entry} for name, entry in data.items()]
        for i, entry in enumerate(data):
            if not isinstance(entry, dict):
                raise TraceError(f"{path}: entry {i + 1} is not an object")
            where = f"{path}: {entry.get('name', f'entry {i + 1}')!s}"
            _add(sizes, entry.get("name"), _size(entry, where), where)
    else:
        with csv_records(path, ("name", "memory_gb")) as table:
            if not {"vcpus", "cpus"} & set(table.header):
                raise TraceError(f"{path}:1: the header lacks column vcpus")
            for line, row in table:
                _add(sizes, row["name"], _size(row, f"{path}:{line}"), f"{path}:{line}")
    if not sizes:
        raise TraceError(f"{path}: no VM types in the file")
    return sizes


def catalog_sizes(vm_types: Iterable[Any]) -> dict[str, VmSize]:
    """Sizes of a config's [[vm_types]] under their names and instance types."""
    sizes: dict[str, VmSize] = {}
    for entry in vm_types:
        size = VmSize(float(entry.cpus), float(entry.memory_gb), int(entry.gpus))
        sizes[entry.name] = size
        if entry.instance_type:
            sizes.setdefault(entry.instance_type, size)
    return sizes


def sizes_of(names: Iterable[str], known: Mapping[str, VmSize]) -> dict[str, VmSize]:
    """The size of each name; UnknownVmSizeError names the unknown ones and the ways to
    give their sizes."""
    wanted = sorted(set(names))
    missing = [name for name in wanted if name not in known]
    if missing:
        raise UnknownVmSizeError(
            f"no size known for {', '.join(missing)}: not an EC2 or GCE type of the bundled "
            f"table; {WAYS_TO_SIZE}"
        )
    return {name: known[name] for name in wanted}
