"""The changes the operations make to a Serve config document: redeployed with new engine settings, scaled in
place. Pure functions: a new document, the given one unchanged."""

from __future__ import annotations

import copy
from typing import Any

from serve_app.names import ENGINE_DEPLOYMENT_PREFIX

from ..plan.steps import Redeploy


def redeployed_config(cfg: dict[str, Any], step: Redeploy) -> dict[str, Any]:
    """``cfg`` (a Serve config document) with ``step``'s engine settings and allowed xargs keys."""
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        args = app.setdefault("args", {})
        for llm in args.get("llm_configs", []):
            llm.setdefault("engine_kwargs", {}).update(copy.deepcopy(step.engine_kwargs))
        if step.allow_xargs:
            xargs = args.setdefault("guard", {}).setdefault("xargs", {})
            xargs["allowed_extra_keys"] = [
                *xargs.get("allowed_extra_keys", []),
                *(k for k in step.allow_xargs if k not in xargs.get("allowed_extra_keys", [])),
            ]
    return new


def scaled_config(cfg: dict[str, Any], replicas: int) -> dict[str, Any]:
    """``cfg`` with every engine deployment's ``num_replicas`` overridden in the ``deployments:`` section (Serve
    applies it in place; the same number under ``args`` would restart every replica)."""
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        deployments = app.setdefault("deployments", [])
        for llm in app.get("args", {}).get("llm_configs", []):
            name = ENGINE_DEPLOYMENT_PREFIX + llm["model_loading_config"]["model_id"]
            entry = next((d for d in deployments if d.get("name") == name), None)
            if entry is None:
                deployments.append(entry := {"name": name})
            entry["num_replicas"] = replicas
    return new
