"""The HTTP port each engine replica opens itself (Ray's direct ingress, where HAProxy forwards to it), found from
the replica's process: the hostile scenario attacks these doors beside the ingress as well as the ingress.

The port range is Serve's (``RAY_SERVE_DIRECT_INGRESS_{MIN,MAX}_HTTP_PORT``, 30000-31000 by default), read from its
private constants module rather than copied, so a Serve that moves it moves this too.
"""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def replica_http_ports(pids: Iterable[int]) -> list[int]:
    """The listening ports in Serve's direct-ingress range of the processes ``pids`` (gone ones are skipped)."""
    from ray.serve._private.constants import (
        RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT,
        RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT,
    )

    ports: set[int] = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections("tcp")
        except psutil.Error:
            continue
        ports |= {
            c.laddr.port
            for c in conns
            if c.status == psutil.CONN_LISTEN
            and RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT <= c.laddr.port <= RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT
        }
    return sorted(ports)
