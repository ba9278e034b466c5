"""Tell systemd how the daemon is doing (sd_notify: one datagram to $NOTIFY_SOCKET).

With `Type=notify` in the unit, systemd considers the service started only once
the API listens (READY=1), and shows STATUS= in `systemctl status`. Outside
systemd NOTIFY_SOCKET is unset and this does nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket


def _send(message: str, address: str) -> None:
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(message.encode())


async def notify(**fields: str) -> bool:
    """Send e.g. notify(READY="1", STATUS="serving"); False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    message = "\n".join(f"{key}={value}" for key, value in fields.items())
    await asyncio.to_thread(_send, message, address)
    return True
