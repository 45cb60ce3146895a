"""Pick TCP ports for servers we start ourselves, away from the kernel's ephemeral range.

Why not ``bind(("127.0.0.1", 0))`` and hand the number on: the kernel picks
that port from the *ephemeral* range (``net.ipv4.ip_local_port_range``),
the same range it uses for the local end of every outgoing connection. A
port is picked, the probe socket closed, and seconds later Ray (or vLLM, or
uvicorn) binds it; in between, any of the hundreds of connections a starting
Ray node opens can take it as its local port, and the server that was meant
to get it fails to bind. For a Ray node that is fatal: ``ray start --block``
kills the whole node when one of its agents exits.

So ports are drawn at random from below the ephemeral range (where the
kernel never assigns anything on its own), checked to be bindable, and never
handed out twice by one process. Random draws keep two processes that pick
at the same time (pytest and a benchmark child) from colliding in practice.
"""

from __future__ import annotations

import random
import socket
import threading

# Below this, ports are conventional service ports (databases, proxies ...).
_LOWEST = 20000
_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically assigned local ports (Linux; IANA's 49152-65535 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


def candidate_range() -> tuple[int, int]:
    """Half-open range ports are drawn from: [_LOWEST, start of the ephemeral range), or above it."""
    lo, hi = ephemeral_range()
    if lo - _LOWEST >= 2000:
        return _LOWEST, lo
    return hi + 1, 65536  # an unusual sysctl: the ephemeral range starts low; use what is above it


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port(rng: random.Random | None = None) -> int:
    """A port nobody listens on now, outside the ephemeral range, not returned before by this process."""
    rng = rng or random.SystemRandom()
    lo, hi = candidate_range()
    with _lock:
        for _ in range(200):
            port = rng.randrange(lo, hi)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free TCP port found in [{lo}, {hi})")
