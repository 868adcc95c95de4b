"""The server's listening socket, bound before the model loads so ``/health`` answers at once."""

from __future__ import annotations

import socket

__all__ = ["base_url", "listen"]


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (0: any free port); IPv6 when ``host``
    has a colon, bracketed or not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the
    # socket says it is TCP, and without it Nagle holds each small SSE event until the
    # client's delayed ACK (~40 ms added to the first token)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def base_url(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 address bracketed, as the start-up lines show it."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"
