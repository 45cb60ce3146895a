"""Offline checks of a RayService manifest: what a Kubernetes API server with KubeRay 1.7 and KubeRay's operator
would refuse, and what Ray Serve and this project would refuse in its ``serveConfigV2``, without a cluster.

Three layers, each the owner's own rules (not a copy of them):

1. **The CRD's schema.** ``deploy/kuberay/ray.io_rayservices.v1.7.0.yaml`` is
   KubeRay v1.7.0's RayService CustomResourceDefinition, unchanged; its served
   storage version's ``openAPIV3Schema`` is what the API server validates a
   RayService against. It is read as JSON Schema (``jsonschema``), with every
   object closed to fields it does not list (``additionalProperties: false``
   where the schema neither gives ``additionalProperties`` nor sets
   ``x-kubernetes-preserve-unknown-fields``): ``kubectl apply``'s default
   field validation (``Strict``) refuses an unknown field, where plain JSON
   Schema would let a misspelt one through. What this layer does not see:
   ``metadata`` (the CRD leaves it to the API server: checked in 2) and
   formats the API server parses itself beyond the schema's patterns.
2. **KubeRay's operator** (``ray-operator/controllers/ray/utils/validation.go``
   at v1.7.0), the rules a manifest of this shape can break: the name (a DNS-1035
   label of at most 47 characters), a container in every group,
   ``minReplicas <= replicas <= maxReplicas``, token authentication only with
   ``rayVersion >= 2.52.0``, an ``upgradeStrategy.type`` it knows.
3. **The Serve config**: ``serveConfigV2`` parsed by Ray's own
   ``ServeDeploySchema`` and this project's typed config
   (:func:`serve_app.config.deploy_config.parse`: lossless, the builder's
   arguments as :class:`~serve_app.config.deploy_config.FuzzServeArgs`, the guard's
   config, the router's name) and every LLM config by ``ray.serve.llm``'s
   ``LLMConfig`` (with ``check_llm=True``: it imports vLLM, about 10 s).

:func:`check_manifest` returns every problem found, each naming where.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from serve_app.config import deploy_config as dc

CRD = dc.PROJECT_ROOT / "deploy" / "kuberay" / "ray.io_rayservices.v1.7.0.yaml"
MAX_NAME = 47  # KubeRay's MaxRayServiceNameLength (MaxRayClusterNameLength 53 - 6)
UPGRADE_TYPES = ("NewClusterWithIncrementalUpgrade", "NewCluster", "None")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others (see the module's docstring)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@functools.cache
def crd_schema(path: Path = CRD) -> dict[str, Any]:
    """The CRD's storage version's ``openAPIV3Schema``, closed, as a JSON Schema."""
    crd = yaml.safe_load(path.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return _closed(version["schema"]["openAPIV3Schema"])


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """Layer 1: where ``doc`` breaks the CRD's schema."""
    validator = jsonschema.Draft7Validator(crd_schema())
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(document)'}: {e.message[:300]}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def operator_errors(doc: dict[str, Any]) -> list[str]:
    """Layer 2: the rules of KubeRay's operator this manifest's shape can break."""
    errors = []
    if doc.get("apiVersion") != "ray.io/v1" or doc.get("kind") != "RayService":
        errors.append(f"apiVersion/kind: {doc.get('apiVersion')}/{doc.get('kind')}, not ray.io/v1/RayService")
    name = str((doc.get("metadata") or {}).get("name", ""))
    if len(name) > MAX_NAME or not DNS1035.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most {MAX_NAME} characters")
    spec = doc.get("spec") or {}
    cluster = spec.get("rayClusterConfig") or {}
    if not (((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}).get("containers"):
        errors.append("spec.rayClusterConfig.headGroupSpec: no container")
    for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
        where = f"spec.rayClusterConfig.workerGroupSpecs.{i}"
        if not ((group.get("template") or {}).get("spec") or {}).get("containers"):
            errors.append(f"{where}: no container")
        low, n, high = group.get("minReplicas", 0), group.get("replicas", 0), group.get("maxReplicas", 0)
        if isinstance(low, int) and isinstance(n, int) and isinstance(high, int) and not low <= n <= high:
            errors.append(f"{where}: replicas {n} outside minReplicas {low} .. maxReplicas {high}")
    token = (cluster.get("authOptions") or {}).get("mode") == "token"
    if token and _version(str(cluster.get("rayVersion", ""))) < (2, 52, 0):
        errors.append("spec.rayClusterConfig.authOptions.mode: token needs rayVersion 2.52.0 or later")
    kind = (spec.get("upgradeStrategy") or {}).get("type")
    if kind is not None and kind not in UPGRADE_TYPES:
        errors.append(f"spec.upgradeStrategy.type: {kind!r}, not one of {', '.join(UPGRADE_TYPES)}")
    return errors


def serve_errors(serve_config: str, check_llm: bool = True) -> list[str]:
    """Layer 3: where ``serveConfigV2`` fails Ray Serve's schema, the project's config or ``LLMConfig``."""
    try:
        document = yaml.safe_load(serve_config)
    except yaml.YAMLError as e:
        return [f"serveConfigV2: not YAML ({e})"]
    if not isinstance(document, dict):
        return ["serveConfigV2: not a mapping"]
    try:
        ServeDeploySchema.model_validate(copy.deepcopy(document))
    except ValidationError as e:
        return [f"serveConfigV2 (Ray Serve's ServeDeploySchema): {_first(e)}"]
    try:
        cfg = dc.parse(document)
    except (ValidationError, ValueError) as e:
        return [f"serveConfigV2 (the project's config): {_first(e) if isinstance(e, ValidationError) else e}"]
    if not check_llm:
        return []
    from ray.serve.llm import LLMConfig  # here, not above: it imports vLLM (about 10 s)

    errors = []
    for app in dc.fuzz_applications(cfg):
        for i, llm in enumerate(app.fuzz_args.llm_configs):
            try:
                LLMConfig.model_validate(llm.to_dict())
            except ValidationError as e:
                errors.append(f"serveConfigV2.applications.{app.name}.llm_configs.{i} (LLMConfig): {_first(e)}")
    return errors


def _first(e: Any) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


def check_manifest(doc: dict[str, Any], check_llm: bool = True) -> list[str]:
    """Every problem of a RayService document, by layer (empty: it passes all three)."""
    errors = schema_errors(doc) + operator_errors(doc)
    serve = (doc.get("spec") or {}).get("serveConfigV2")
    if isinstance(serve, str):
        errors += serve_errors(serve, check_llm)
    else:
        errors.append("spec.serveConfigV2: missing (a string holding the Serve config)")
    return errors


def documents(path: Path) -> Iterator[dict[str, Any]]:
    """The YAML documents of a manifest file."""
    yield from (d for d in yaml.safe_load_all(path.read_text()) if d is not None)
