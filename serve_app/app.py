"""Application builder for ``serve run`` / ``serve deploy`` (work in progress, issue 4).

``model_source: fixture`` resolves to the locally built fixture model.
"""

from __future__ import annotations

import copy
from typing import Any

from ray.serve.llm import build_openai_app


def build_app(args: dict[str, Any]):
    args = copy.deepcopy(args)
    for cfg in args.get("llm_configs", []):
        loading = cfg.setdefault("model_loading_config", {})
        if loading.get("model_source") == "fixture":
            from fixture_model.build import ensure_model

            loading["model_source"] = str(ensure_model())
    args.setdefault("ingress_cls_config", {"ingress_cls": "serve_app.router:FuzzRouter"})
    return build_openai_app(args)
