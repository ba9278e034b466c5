"""policies/connections.py: the connection cap, what one client is, who makes room."""

from __future__ import annotations

import pytest

from policies.connections import MIN_CONNECTIONS, client_key, connection_cap, make_room


def test_the_cap_keeps_the_reserved_descriptors_out_of_clients_reach():
    # systemd's default soft limit: the reserve comes off it, max_connections is moot.
    assert connection_cap(1000, 1024, 256) == 768
    # The unit's LimitNOFILE=65536: max_connections decides.
    assert connection_cap(1000, 65536, 256) == 1000


def test_a_limit_that_leaves_too_few_connections_is_refused_with_what_to_do():
    assert connection_cap(1000, 256 + MIN_CONNECTIONS, 256) == MIN_CONNECTIONS
    with pytest.raises(ValueError, match=r"RLIMIT_NOFILE 256\) leaves 0 connections.*LimitNOFILE"):
        connection_cap(1000, 256, 256)
    with pytest.raises(ValueError, match="leaves 8 connections"):
        connection_cap(8, 65536, 256)


@pytest.mark.parametrize(
    ("host", "client"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("::ffff:10.1.2.3", "10.1.2.3"),  # IPv4 on a dual-stack socket is still IPv4
        ("2001:db8:1:2:0:0:0:1", "2001:db8:1:2::1"),
        # Another client, though in the same /64: a cluster's hosts may share one.
        ("2001:db8:1:2::2", "2001:db8:1:2::2"),
        ("fe80::1%eth0", "fe80::1"),
        ("", ""),  # no peer address (a UNIX socket)
    ],
)
def test_one_client_is_one_address(host, client):
    assert client_key(host) == client


def test_the_oldest_connection_not_in_a_request_makes_room():
    assert make_room([("a", True), ("b", False), ("c", False)]) == "b"
    assert make_room([("a", True), ("b", True)]) is None
    assert make_room([]) is None
