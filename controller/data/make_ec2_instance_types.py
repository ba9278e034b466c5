#!/usr/bin/env python3
"""Regenerate ec2_instance_types.json (beside this script): the vCPUs, memory and GPUs
of every EC2 instance type, for price traces that name types only (controller.traces.vm_size).

Source: moto's `moto/ec2/resources/instance_types.json.gz` (moto is a dev dependency;
Apache-2.0, https://github.com/getmoto/moto), which holds the DescribeInstanceTypes
answer of every type, current and previous generation: DefaultVCpus,
MemoryInfo.SizeInMiB (written here in GiB, as AWS's tables give it) and the GPU
count. Types moto's table lacks (older GPU, cluster and storage types AWS no longer
lists in that API) come from SUPPLEMENT, copied from AWS's "Previous generation
instances" and accelerated-computing pages.

Run `.venv/bin/python controller/data/make_ec2_instance_types.py` after upgrading moto.
"""

from __future__ import annotations

import gzip
import json
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parent / "ec2_instance_types.json"

# name: (vCPUs, memory GiB, GPUs); only types moto's table does not have.
SUPPLEMENT = {
    "cc2.8xlarge": (32, 60.5, 0),
    "cg1.4xlarge": (16, 22.5, 2),
    "cr1.8xlarge": (32, 244.0, 0),
    "hi1.4xlarge": (16, 60.5, 0),
    "hs1.8xlarge": (16, 117.0, 0),
    "g2.2xlarge": (8, 15.0, 1),
    "g2.8xlarge": (32, 60.0, 4),
    "g3s.xlarge": (4, 30.5, 1),
    "g3.4xlarge": (16, 122.0, 1),
    "g3.8xlarge": (32, 244.0, 2),
    "g3.16xlarge": (64, 488.0, 4),
    "g4ad.xlarge": (4, 16.0, 1),
    "g4ad.2xlarge": (8, 32.0, 1),
    "g4ad.4xlarge": (16, 64.0, 1),
    "g4ad.8xlarge": (32, 128.0, 2),
    "g4ad.16xlarge": (64, 256.0, 4),
    "p2.xlarge": (4, 61.0, 1),
    "p2.8xlarge": (32, 488.0, 8),
    "p2.16xlarge": (64, 732.0, 16),
    "p3.2xlarge": (8, 61.0, 1),
    "p3.8xlarge": (32, 244.0, 4),
    "p3.16xlarge": (64, 488.0, 8),
    "f1.2xlarge": (8, 122.0, 0),
    "f1.4xlarge": (16, 244.0, 0),
    "f1.16xlarge": (64, 976.0, 0),
    "u-9tb1.112xlarge": (448, 9216.0, 0),
    "u-12tb1.112xlarge": (448, 12288.0, 0),
    "u-18tb1.112xlarge": (448, 18432.0, 0),
    "u-24tb1.112xlarge": (448, 24576.0, 0),
}


def moto_types() -> tuple[str, dict[str, tuple[int, float, int]]]:
    """(moto's version, name -> (vCPUs, memory GiB, GPUs)) from moto's table."""
    import moto

    path = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    types = {}
    for name, info in raw.items():
        gpus = sum(g.get("Count", 0) for g in info.get("GpuInfo", {}).get("Gpus", []))
        memory_gib = round(info["MemoryInfo"]["SizeInMiB"] / 1024, 3)
        types[name] = (int(info["VCpuInfo"]["DefaultVCpus"]), memory_gib, int(gpus))
    return metadata.version("moto"), types


def _order(name: str) -> tuple[str, str]:
    family, _, size = name.partition(".")
    return family, size


def main() -> None:
    version, types = moto_types()
    added = {name: size for name, size in SUPPLEMENT.items() if name not in types}
    types |= added
    body = ",\n".join(
        f"  {json.dumps(name)}: {json.dumps(list(types[name]))}"
        for name in sorted(types, key=_order)
    )
    about = {
        "about": "vCPUs, memory (GiB) and GPUs of every EC2 instance type, for price traces "
        "that name types only (spotbag index / simulate-hopping). Made by "
        "make_ec2_instance_types.py; do not edit by hand.",
        "source": f"moto {version} moto/ec2/resources/instance_types.json.gz (Apache-2.0, "
        f"https://github.com/getmoto/moto), plus {len(added)} older types from AWS's "
        "previous-generation and accelerated-computing pages",
        "columns": ["vcpus", "memory_gb", "gpus"],
    }
    head = ",\n".join(f" {json.dumps(key)}: {json.dumps(value)}" for key, value in about.items())
    OUT.write_text(f'{{\n{head},\n "types": {{\n{body}\n }}\n}}\n', encoding="utf-8")
    print(f"{OUT}: {len(types)} types ({len(added)} from the supplement)")


if __name__ == "__main__":
    main()
