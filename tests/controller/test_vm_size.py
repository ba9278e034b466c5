"""controller.traces.vm_size: the bundled EC2 and GCE size table, sizes from a --types file
or a config's catalog, and the error for a type none of them knows."""

from __future__ import annotations

import fnmatch
import gzip
import json
import tomllib
from pathlib import Path

import pytest

from controller.traces.trace_io import TraceError
from controller.traces.vm_size import (
    UnknownVmSizeError,
    VmSize,
    bundled_sizes,
    catalog_sizes,
    ec2_sizes,
    gce_sizes,
    read_sizes_file,
    sizes_of,
)
from tests.conftest import REPO


def test_the_papers_ec2_types_and_older_generations_have_sizes():
    sizes = ec2_sizes()
    # The index-tracking paper's experiment (SoCC'18 §6): vCPUs and GiB as AWS lists them.
    assert sizes["m4.large"] == VmSize(2, 8.0)
    assert sizes["m4.2xlarge"] == VmSize(8, 32.0)
    assert sizes["c4.2xlarge"] == VmSize(8, 15.0)
    assert sizes["r4.xlarge"] == VmSize(4, 30.5)
    for name in ("m1.small", "t1.micro", "c1.xlarge", "m2.4xlarge", "cc2.8xlarge", "hs1.8xlarge"):
        assert name in sizes, name
    assert sizes["g2.2xlarge"] == VmSize(8, 15.0, 1)
    assert sizes["p4d.24xlarge"].gpus == 8
    assert len(sizes) > 1000
    assert all(s.vcpus > 0 and s.memory_gb > 0 and s.gpus >= 0 for s in sizes.values())


def test_the_ec2_table_holds_every_type_of_its_source():
    moto = pytest.importorskip("moto")
    source = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    with gzip.open(source, "rt") as handle:
        types = json.load(handle)
    assert set(types) <= set(ec2_sizes())


def test_the_common_gce_types_come_from_their_memory_per_vcpu():
    sizes = gce_sizes()
    assert sizes["n1-standard-4"] == VmSize(4, 15.0)
    assert sizes["n1-highcpu-16"] == VmSize(16, 14.4)
    assert sizes["n1-highmem-96"] == VmSize(96, 624.0)
    assert sizes["e2-standard-8"] == VmSize(8, 32.0)
    assert sizes["e2-medium"] == VmSize(2, 4.0)
    assert sizes["n2-highmem-128"] == VmSize(128, 864.0)  # off the 8 GB/vCPU ratio
    assert sizes["n2d-highcpu-224"] == VmSize(224, 224.0)
    assert sizes["c2-standard-60"] == VmSize(60, 240.0)
    assert sizes["c2d-highcpu-112"] == VmSize(112, 224.0)
    assert sizes["c3-highmem-176"] == VmSize(176, 1408.0)
    assert sizes["t2d-standard-1"] == VmSize(1, 4.0)
    assert sizes["f1-micro"] == VmSize(1, 0.6) and sizes["g1-small"] == VmSize(1, 1.7)
    assert sizes["m2-ultramem-416"] == VmSize(416, 11776.0)
    assert not set(sizes) & set(ec2_sizes())


def test_the_ec2_table_is_package_data():
    # An installed wheel carries what pyproject's package-data names.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]
    wanted = patterns.get("controller", []) + patterns.get("*", [])
    for path in (REPO / "controller" / "data").glob("*.json"):
        relative = path.relative_to(REPO / "controller").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in wanted), relative


def test_a_types_file_as_csv_or_json(tmp_path):
    csv_path = tmp_path / "sizes.csv"
    csv_path.write_text("name,vcpus,memory_gb,gpus\nz9.huge,96,768,0\nmy-gpu,8,61,1\n")
    assert read_sizes_file(csv_path) == {
        "z9.huge": VmSize(96, 768.0),
        "my-gpu": VmSize(8, 61.0, 1),
    }
    listed = tmp_path / "sizes.json"
    listed.write_text(json.dumps([{"name": "z9.huge", "vcpus": 96, "memory_gb": 768}]))
    assert read_sizes_file(listed) == {"z9.huge": VmSize(96, 768.0)}
    mapped = tmp_path / "sizes.json.gz"
    mapped.write_bytes(gzip.compress(b'{"z9.huge": {"cpus": 96, "memory_gb": 768}}'))
    assert read_sizes_file(mapped) == {"z9.huge": VmSize(96, 768.0)}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "name,memory_gb\nx,4\n", "a.csv:1: the header lacks column vcpus"),
        ("b.csv", "name,vcpus,memory_gb\nx,4,0\n", "b.csv:2: memory_gb must be a number > 0"),
        ("c.csv", "name,vcpus,memory_gb\nx,four,8\n", "c.csv:2: vcpus must be a number > 0"),
        ("d.csv", "name,vcpus,memory_gb\nx,1,2\nx,2,4\n", "d.csv:3: 'x' is given twice"),
        ("e.csv", "name,vcpus,memory_gb\n", "e.csv: no VM types in the file"),
        ("f.json", '[{"name": "x", "vcpus": 2}]', "f.json: x: memory_gb must be a number > 0"),
        ("g.json", "[1]", "g.json: entry 1 is not an object"),
        ("h.json", '{"x": ', "h.json:1: not valid JSON"),
    ],
)
def test_a_bad_types_file_is_named(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=message):
        read_sizes_file(path)


def test_a_catalog_sizes_its_names_and_instance_types():
    from controller.config import VmTypeConfig

    catalog = [
        VmTypeConfig(
            name="big-1b", instance_type="z9.huge", cpus=96, memory_gb=768, spot_price_per_hour=1
        ),
        VmTypeConfig(name="local-2", cpus=2, memory_gb=4, spot_price_per_hour=0.1),
    ]
    sizes = catalog_sizes(catalog)
    assert sizes["big-1b"] == sizes["z9.huge"] == VmSize(96, 768.0)
    assert sizes["local-2"] == VmSize(2, 4.0)


def test_an_unknown_type_names_the_ways_to_size_it():
    assert sizes_of(["m4.large", "e2-medium"], bundled_sizes())["e2-medium"].memory_gb == 4.0
    with pytest.raises(UnknownVmSizeError) as caught:
        sizes_of(["z9.huge", "m4.large", "a0.tiny"], bundled_sizes())
    message = str(caught.value)
    assert message.startswith("no size known for a0.tiny, z9.huge:")
    assert "--types FILE" in message and "--config FILE" in message
