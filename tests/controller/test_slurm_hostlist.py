"""Hostlists read without expanding what they do not have to
(controller/slurm/commands.py): a callback's hostlist is bounded by the pools' nodes
before it is expanded, a pool's by a sane maximum, and a malformed one is an error
rather than a node name.
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import Config, ConfigError, SlurmPoolConfig
from controller.slurm.commands import HostlistError, hostlist_count, hostlist_expand
from controller.slurm.pools import PoolBook


def test_hostlists_expand_as_slurm_writes_them():
    assert hostlist_expand("spot-[0-2,7],gpu1") == ["spot-0", "spot-1", "spot-2", "spot-7", "gpu1"]
    assert hostlist_expand("n[01-03]") == ["n01", "n02", "n03"]
    assert hostlist_expand("n[08-10]x") == ["n08x", "n09x", "n10x"]
    assert hostlist_expand("") == []


@pytest.mark.parametrize("text", ["spot-[a-3]", "spot-[3-1]", "spot-[1-", "spot-]1[", "a[1]b[2]"])
def test_a_malformed_hostlist_is_an_error_not_a_node_name(text):
    with pytest.raises(HostlistError):
        hostlist_expand(text)


def test_a_bounded_expansion_counts_before_it_makes_a_single_name():
    """The callback's case: 17 characters that name 10^8 nodes (expanding them took
    minutes and 2.7 GB). Refused having allocated next to nothing."""
    tracemalloc.start()
    try:
        with pytest.raises(HostlistError, match="names 100000000 nodes, more than the 4"):
            hostlist_expand("spot-[0-99999999]", limit=4)
        with pytest.raises(HostlistError, match="more than the 4"):
            hostlist_expand("spot-[0-3],spot-[0-999999999999]", limit=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert hostlist_count("spot-[0-99999999],x") == 100_000_001
    assert hostlist_expand("spot-[0-3]", limit=4) == ["spot-0", "spot-1", "spot-2", "spot-3"]


ranges = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 5)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
    min_size=1,
    max_size=4,
)
groups = st.tuples(st.sampled_from(["spot-", "n", "gpu"]), ranges, st.sampled_from(["", "x"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(groups | st.sampled_from(["head", "login1"]), min_size=1, max_size=4))
def test_the_count_is_the_number_of_names(parts):
    text = ",".join(p if isinstance(p, str) else f"{p[0]}[{','.join(p[1])}]{p[2]}" for p in parts)
    names = hostlist_expand(text)
    assert hostlist_count(text) == len(names)
    assert hostlist_expand(text, limit=len(names)) == names
    with pytest.raises(HostlistError):
        hostlist_expand(text, limit=len(names) - 1)


def test_a_pool_whose_nodes_cannot_be_read_or_are_too_many_is_refused():
    for nodes, words in (("spot-[3-1]", "runs backwards"), ("spot-[0-99999999]", "more than")):
        pool = SlurmPoolConfig(partition="spot", nodes=nodes, vm_types=("local-2",))
        with pytest.raises(ConfigError, match=f"slurm.pools.*spot.*{words}"):
            PoolBook([pool], Config().catalog())
