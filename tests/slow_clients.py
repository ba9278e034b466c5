"""Slow HTTP clients ("slowloris"), as the attacker of issue 23 ran them.

`python -m tests.slow_clients --port P --connections 1100 --duration-s 40` keeps that
many connections to the daemon, each sending one byte of a request's headers every
`--interval-s` (the headers never end), and opens a new one soon after the server closes
one (0.5 to 1.5 s later): the pressure stays on for the whole run, as a real attacker's
would. It runs in a process of its own so that its descriptors (one per connection)
count against its own limit, not the test's, and prints one JSON line of what it saw:

- opened: connections the kernel completed (the server may not have accepted them yet);
- closed_by_server: connections the server ended (refused over a cap, or timed out);
- answered: of those, the ones that got an answer first (a 503 refusal);
- most_open: most connections open at once, as the clients saw them;
- longest_open_s: the longest any connection stayed open;
- connect_errors: connection attempts that failed (refused, reset, timed out).

The clients connect from `--sources` (loopback addresses such as 127.0.0.2 stand for
other hosts: the daemon counts connections per client address), taking them in turn.
Each is an asyncio protocol with a timer, not a task: a thousand of them cost the test
machine little CPU, so what is measured is the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import time

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: spotbag\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
RECONNECT_S = (0.5, 1.5)


class Counts:
    def __init__(self) -> None:
        self.opened = 0
        self.closed_by_server = 0
        self.answered = 0
        self.connect_errors = 0
        self.open_now = 0
        self.most_open = 0
        self.longest_open_s = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "opened": self.opened,
            "closed_by_server": self.closed_by_server,
            "answered": self.answered,
            "most_open": self.most_open,
            "longest_open_s": round(self.longest_open_s, 1),
            "connect_errors": self.connect_errors,
        }


class SlowClient(asyncio.Protocol):
    """One connection that sends a byte every interval_s until the server closes it."""

    def __init__(self, counts: Counts, interval_s: float, closed: asyncio.Future) -> None:
        self.counts = counts
        self.interval_s = interval_s
        self.closed = closed
        self.transport: asyncio.Transport | None = None
        self.sent = 0
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        self.opened_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.opened_at = time.monotonic()
        self.counts.opened += 1
        self.counts.open_now += 1
        self.counts.most_open = max(self.counts.most_open, self.counts.open_now)
        self.send_a_byte()

    def send_a_byte(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(REQUEST[self.sent % len(REQUEST) : self.sent % len(REQUEST) + 1])
        self.sent += 1
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.interval_s, self.send_a_byte)

    def data_received(self, data: bytes) -> None:
        self.answered = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.counts.open_now -= 1
        self.counts.longest_open_s = max(
            self.counts.longest_open_s, time.monotonic() - self.opened_at
        )
        if not self.closed.done():
            self.closed.set_result(None)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.abort()


async def keep_one_slow_client(
    host: str, port: int, source: str, interval_s: float, counts: Counts, stop: asyncio.Event
) -> None:
    """A slow client, again and again: a new connection soon after each one ends."""
    loop = asyncio.get_running_loop()
    rng = random.Random()
    while not stop.is_set():
        closed: asyncio.Future = loop.create_future()
        try:
            _, client = await asyncio.wait_for(
                loop.create_connection(
                    lambda closed=closed: SlowClient(counts, interval_s, closed),  # type: ignore[misc]
                    host,
                    port,
                    local_addr=(source, 0) if source else None,
                ),
                timeout=10.0,
            )
        except (OSError, TimeoutError):
            counts.connect_errors += 1
        else:
            try:
                await closed
            finally:
                client.stop()
            if not stop.is_set():
                counts.closed_by_server += 1
                counts.answered += client.answered
        await asyncio.sleep(rng.uniform(*RECONNECT_S))


async def flood(
    host: str,
    port: int,
    connections: int,
    interval_s: float,
    duration_s: float,
    sources: list[str],
) -> Counts:
    counts = Counts()
    stop = asyncio.Event()
    clients = []
    for i in range(connections):
        source = sources[i % len(sources)] if sources else ""
        clients.append(
            asyncio.create_task(keep_one_slow_client(host, port, source, interval_s, counts, stop))
        )
        await asyncio.sleep(0.001)  # a fast ramp, not one SYN burst the backlog drops
    await asyncio.sleep(duration_s)
    stop.set()
    for client in clients:
        client.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--sources", default="", help="local addresses to connect from, comma-separated"
    )
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--interval-s", type=float, default=3.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    args = parser.parse_args()
    # One descriptor per connection, plus Python's own.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = args.connections + 100
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    sources = [a for a in args.sources.split(",") if a]
    counts = asyncio.run(
        flood(args.host, args.port, args.connections, args.interval_s, args.duration_s, sources)
    )
    print(json.dumps(counts.as_dict()), flush=True)


if __name__ == "__main__":
    main()
