"""Bag spec files: YAML aliases are bounded before anything is expanded."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from controller.cli.specfile import (
    MAX_EXPANDED_BYTES,
    SpecFileError,
    _Yaml12Loader,
    expanded_size,
    load_spec_text,
)


def laughs(levels: int, width: int = 9) -> str:
    """A "billion laughs" document: each level lists the previous one `width` times."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + f"\nparameters: {{x: *l{levels - 1}}}\n"


def composed(text: str) -> yaml.Node:
    loader = _Yaml12Loader(text)
    try:
        node = loader.get_single_node()
        assert node is not None
        return node
    finally:
        loader.dispose()


def test_the_billion_laughs_is_refused_at_once_with_what_is_wrong():
    text = laughs(9)
    assert len(text) < 520  # the "500-byte YAML file"
    started = time.monotonic()
    with pytest.raises(SpecFileError) as refused:
        load_spec_text(text, "bomb.yaml")
    assert time.monotonic() - started < 0.5  # sized on the node graph, never expanded
    assert str(refused.value) == (
        "bomb.yaml: its YAML aliases (*name) would expand it to more than 64 MB of JSON, "
        "larger than any bag the API takes (refused before expanding it)"
    )
    # Deeper and wider ones too: the graph is as small as the file.
    with pytest.raises(SpecFileError, match="aliases"):
        load_spec_text(laughs(60, width=2), "deep.yaml")
    assert time.monotonic() - started < 1.0


def test_the_size_is_that_of_the_json_expanded():
    # Aliases used as people use them: shared settings and values.
    text = (
        "defaults: &d {cpus: 2, memory_gb: 1.5}\n"
        "values: &v [0.1, 0.2, 'three', true, null]\n"
        "account: lab\ncommand: prog {a} {b}\nmax_runtime_s: 60\n"
        "resources: *d\nparameters: {a: *v, b: *v}\nenv: {X: 'a b', Y: \"\"}\n"
    )
    data = load_spec_text(text, "bag.yaml")
    assert data["resources"] == {"cpus": 2, "memory_gb": 1.5}
    assert data["parameters"]["b"] == [0.1, 0.2, "three", True, None]
    actual = len(json.dumps(data, separators=(",", ":")))
    estimate = expanded_size(composed(text), "bag.yaml")
    assert actual <= estimate <= 1.5 * actual
    # The laughs: 9**3 "lol"s at three levels, each counted through every alias.
    three = laughs(3)
    actual = len(json.dumps(yaml.load(three, Loader=_Yaml12Loader), separators=(",", ":")))
    assert actual <= expanded_size(composed(three), "x.yaml") <= 1.5 * actual


def test_the_bound_is_the_api_body_limit_and_is_inclusive():
    text = laughs(4)  # 9**4 "lol"s twice (l3, and x), and fewer: about 90 KB expanded
    size = expanded_size(composed(text), "x.yaml")
    assert 80_000 < size < 120_000
    assert expanded_size(composed(text), "x.yaml", limit=size) == size
    assert expanded_size(composed(text), "x.yaml", limit=size - 1) == size  # limit + 1: past it
    assert expanded_size(composed(laughs(20)), "x.yaml", limit=100) == 101  # capped, not 9**20
    assert MAX_EXPANDED_BYTES == 64 * 1024 * 1024  # [api] max_body_mb's default
    assert load_spec_text(text, "x.yaml")["parameters"]["x"][8][8][8][8] == "lol"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: &a [*a]\n", "line 1, column 4: an alias is used inside its own anchor"),
        ("a: &a {b: [1, {c: *a}]}\n", "line 1, column 4: an alias is used inside its own anchor"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ],
)
def test_documents_that_contain_themselves_or_nest_too_deeply_are_refused(text, words):
    with pytest.raises(SpecFileError) as refused:
        load_spec_text(text, "odd.yaml")
    assert words in str(refused.value) and str(refused.value).startswith("odd.yaml")


def test_deep_json_is_refused_too():
    with pytest.raises(SpecFileError, match=r"bag\.json is nested too deeply"):
        load_spec_text("[" * 100_000 + "]" * 100_000, "bag.json")
