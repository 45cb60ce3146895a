"""The Ray Serve application of patched vLLM engines (``import_path: serve_app.app:build_app``).

Laid out by role, as ``ray.serve.llm`` lays out its own: :mod:`serve_app.config` (the typed deployment config),
:mod:`serve_app.ingress` (edge, guard, policies, probes), :mod:`serve_app.routing` (the fuzz-aware router),
:mod:`serve_app.engine` (the engine replica, its cores and environment), :mod:`serve_app.observability` (the
metrics contract); :mod:`serve_app.ray_internals` holds every private Ray symbol used.

The public surface is ``__all__`` below. Its names load on first use (PEP 562), so that a light import (the
cluster environment's table in ``scripts/env.sh``, the guard's policy in a unit test) does not pay for Ray Serve
and vLLM.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["FuzzServeArgs", "GuardConfig", "ServeConfig", "build_app", "load_config"]

_PUBLIC = {
    "build_app": ("serve_app.app", "build_app"),
    "FuzzServeArgs": ("serve_app.config.deploy_config", "FuzzServeArgs"),
    "ServeConfig": ("serve_app.config.deploy_config", "ServeConfig"),
    "load_config": ("serve_app.config.deploy_config", "load"),
    "GuardConfig": ("serve_app.ingress.guard", "GuardConfig"),
}

if TYPE_CHECKING:
    from serve_app.app import build_app
    from serve_app.config.deploy_config import FuzzServeArgs, ServeConfig
    from serve_app.config.deploy_config import load as load_config
    from serve_app.ingress.guard import GuardConfig


def __getattr__(name: str) -> Any:
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'serve_app' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attr)
