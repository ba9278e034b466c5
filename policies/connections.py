"""How many HTTP connections the daemon holds, and which one gives way (issue 23).

Every open connection is a file descriptor, and the daemon shares its descriptor limit
(RLIMIT_NOFILE) with its own work: the database, job logs, job processes, Slurm
commands, cloud API sessions. Clients that open connections and send nothing useful
(slow headers, a "slowloris") once took all of them, so that jobs failed with EMFILE
and nothing answered /healthz. The rules here keep a share of descriptors out of the
clients' reach and say which connection makes room for a new one:

- `connection_cap`: the most connections open at once, so many descriptors below the
  limit that the daemon's own work always finds some free;
- `client_key`: what counts as one client for the per-client cap: its address (an IPv4
  address mapped into IPv6 is that IPv4 address). Not an IPv6 /64, as internet-facing
  servers count: the daemon serves a cluster, whose hosts may all share one /64; a
  client with many addresses is held by the total cap and `make_room` instead;
- `make_room`: at the cap, the oldest connection that is not in a request (idle on
  keep-alive, or still sending its headers) is closed for the new one; a client that
  sends its request at once is thus never shut out by slow ones, from however many
  addresses they come. Only when every connection is in a request is the new one
  refused.

Pure: the API's connection gate (controller/api/limits.py) counts and acts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import TypeVar

MIN_CONNECTIONS = 16  # fewer would leave the API unusable: refuse to start instead

C = TypeVar("C")


def connection_cap(max_connections: int, nofile_soft: int, reserved_fds: int) -> int:
    """The most HTTP connections to hold: `max_connections`, but never more than the
    descriptor limit leaves once `reserved_fds` are kept for the daemon's own work.
    Raises ValueError when that leaves fewer than MIN_CONNECTIONS."""
    cap = min(max_connections, nofile_soft - reserved_fds)
    if cap < MIN_CONNECTIONS:
        raise ValueError(
            f"the descriptor limit (RLIMIT_NOFILE {nofile_soft}) leaves {max(cap, 0)} "
            f"connections after [api] reserved_fds ({reserved_fds}); at least "
            f"{MIN_CONNECTIONS} are needed: raise the limit (LimitNOFILE= in the unit, "
            "ulimit -n) or lower reserved_fds"
        )
    return cap


def client_key(host: str) -> str:
    """The client a peer address belongs to: the address, in one spelling (an IPv4
    address mapped into IPv6 as IPv4, a link-local one without its zone). Anything
    unparsable (a UNIX socket's empty peer) is its own client."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def make_room(connections_oldest_first: Iterable[tuple[C, bool]]) -> C | None:
    """The connection to close for a new one at the cap: the oldest of those not in a
    request (the flag says whether it is in one); None when all are."""
    for connection, in_request in connections_oldest_first:
        if not in_request:
            return connection
    return None
