"""The Serve config file (``serve_config.yaml``) as one typed document, and every change the project makes to it.

Why one home: the file used to travel as a raw dict that the load tests, the
local cluster rig and the benchmarks each edited by hand (``cfg["applications"]
[0]["args"]["llm_configs"]...``), each with its own idea of which keys exist and
what a missing one means. Here the whole file is a pydantic model built on Ray
Serve's own schema (:class:`ray.serve.schema.ServeDeploySchema`, pydantic v2 in
this Ray), with our application's builder arguments typed
(:class:`FuzzServeArgs`) where Ray keeps ``args`` as a free dict; every change is
a pure function (a config in, a new config out, the given one unchanged, no
I/O); and ``tests/test_deploy_config.py`` fails any module elsewhere that reads
or writes the file's keys by hand.

Lossless: :func:`parse` refuses a document whose :func:`to_document` would not
give it back key for key (Ray's schema silently drops a key it does not know,
which would deploy something else than the file says). Only what a file says is
dumped (``exclude_unset``): Ray's and our defaults stay defaults, as in the file.

The LLM configs are a small model of the fields of ``ray.serve.llm``'s
``LLMConfig`` this project reads or changes (:class:`LLMSpec`), every other field
kept as written: ``LLMConfig`` itself imports vLLM (about 11 s) and its dump adds
fields the file does not have (``accelerator_config``), so it validates them in
full where the app is built (:func:`serve_app.app.build_app`) and in the schema
test, not here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, WrapValidator
from ray.serve.config import ProxyLocation
from ray.serve.schema import DeploymentSchema, HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema

from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX
from serve_app.ingress.guard import GuardConfig
from serve_app.routing.routers import ROUTERS, Routing

# The import path of this project's application builder: an application with it has FuzzServeArgs as args.
BUILDER = "serve_app.app:build_app"
# Where the shipped config lives (the project's root).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = PROJECT_ROOT / "serve_config.yaml"
# Serve's HTTP port when http_options does not name one (HTTPOptionsSchema's default).
DEFAULT_HTTP_PORT = HTTPOptionsSchema.model_fields["port"].default


M = TypeVar("M", bound=BaseModel)


# ----------------------------------------------------------------------------- the model
class ModelLoading(BaseModel):
    """``model_loading_config`` of an LLM config: the fields read here; any other kept as written."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_id: str | None = None
    model_source: Any = None  # a path or hub id (str), or LLMConfig's cloud-mirror config


class DeploymentOptions(BaseModel):
    """An LLM config's ``deployment_config`` (Serve deployment options): the fields read or changed here; any
    other kept as written (Ray validates them when the app is built)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    num_replicas: int | Literal["auto"] | None = None
    autoscaling_config: dict[str, Any] | None = None
    request_router_config: dict[str, Any] | None = None

    def max_replicas(self) -> int | float:
        """The most replicas these options let Serve run (``num_replicas: auto`` autoscales: unbounded)."""
        if self.num_replicas == "auto":
            return float("inf")
        if self.autoscaling_config:
            return int(self.autoscaling_config.get("max_replicas", 1))
        return 1 if self.num_replicas is None else self.num_replicas


class LLMSpec(BaseModel):
    """One entry of ``llm_configs``: a ``ray.serve.llm.LLMConfig`` as written, with the fields this project reads
    or changes typed (module docstring: why not ``LLMConfig`` itself)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_loading_config: ModelLoading = Field(default_factory=ModelLoading)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    deployment_config: DeploymentOptions = Field(default_factory=DeploymentOptions)

    @property
    def model_id(self) -> str | None:
        return self.model_loading_config.model_id

    def to_dict(self) -> dict[str, Any]:
        """What ``LLMConfig.model_validate`` gets: the config as written (a deep copy)."""
        return copy.deepcopy(self.model_dump(mode="json", exclude_unset=True))


class FuzzServeArgs(BaseModel):
    """The builder's arguments (``args:`` of the application in ``serve_config.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    llm_configs: tuple[LLMSpec, ...] = Field(min_length=1, description="ray.serve.llm LLMConfigs")
    guard: GuardConfig = Field(default_factory=GuardConfig)
    routing: Routing = "power_of_two"
    ingress: Literal["direct", "router"] = Field(
        "direct",
        description="direct: Ray's direct streaming through HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1 for "
        "`ray start`), the checks inside each replica (serve_app/engine/direct_server.py); router: "
        "a FuzzIngress deployment (the HTTP ingress) in front of the replicas (Serve's default path)",
    )
    ingress_deployment_config: dict[str, Any] = Field(
        default_factory=dict, description="Serve options of the ingress deployment (ingress: router)"
    )
    engine_cores_per_replica: int | None = Field(
        None,
        ge=1,
        description="CPU hosts: bind each engine replica's OpenMP threads to its own this many cores "
        "(by its rank on the node, serve_app/engine/core_binding.py); null: vLLM's auto binding",
    )
    engine_replicas: int | Literal["fit"] | None = Field(
        None,
        description="engine replicas per model: a number, or fit: as many as the cluster's CPUs hold, "
        "engine_cores_per_replica (1 if unset) + 1 for the replica's HTTP frontend each, per "
        "node; null: as each llm_config's deployment_config says (num_replicas, autoscaling_config)",
    )
    shm_wait: bool = Field(
        True,
        description="the shm_wait patch in this app's engines (EngineCore and its worker nap instead of "
        "spinning while they wait for each other; only where the worker is a process of its own: "
        "the cpu_inproc patch off); false where they have a core to themselves",
    )

    def server_kwargs(self) -> dict[str, Any]:
        """What every engine replica of this app is bound with (serve_app.engine.core_binding.EngineServer)."""
        return {"engine_cores_per_replica": self.engine_cores_per_replica, "shm_wait": self.shm_wait}


def _args_of_the_builder(value: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
    """``args`` is :class:`FuzzServeArgs` for this project's builder; any other builder's arguments (the
    benchmarks' stock ``ray.serve.llm`` apps) stay the free dict Serve passes on (never guessed from their shape:
    ``{"llm_configs": [...]}`` would pass for ours)."""
    if info.data.get("import_path") == BUILDER:
        return value if isinstance(value, FuzzServeArgs) else FuzzServeArgs.model_validate(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"the arguments of {info.data.get('import_path')} are a mapping, not {type(value).__name__}")
    return copy.deepcopy(dict(value))


class Application(ServeApplicationSchema):
    """One application of the file: Serve's schema, with our builder's ``args`` typed."""

    model_config = ConfigDict(frozen=True)

    # Ray types args as a free dict; the narrower type here is the point (mypy's [assignment]: a field's type
    # changed in a subclass, which pydantic supports)
    args: Annotated[FuzzServeArgs | dict[str, Any], WrapValidator(_args_of_the_builder)] = Field(  # type: ignore[assignment]
        default_factory=dict, description="the builder's arguments (FuzzServeArgs for serve_app.app:build_app)"
    )

    @property
    def fuzz_args(self) -> FuzzServeArgs:
        """This application's builder arguments; an error for an application of another builder."""
        if not isinstance(self.args, FuzzServeArgs):
            raise ValueError(f"application {self.name!r} is built by {self.import_path}, not {BUILDER}")
        return self.args

    @property
    def env_vars(self) -> dict[str, str]:
        """``runtime_env.env_vars``, as strings (what the replicas' processes see)."""
        return {k: str(v) for k, v in ((self.runtime_env or {}).get("env_vars") or {}).items()}


class ServeConfig(ServeDeploySchema):
    """The whole Serve config file: Ray's ``ServeDeploySchema`` with :class:`Application` s."""

    model_config = ConfigDict(frozen=True)

    applications: list[Application] = Field(default_factory=list)  # type: ignore[assignment]


# ----------------------------------------------------------------------------- load and dump
def to_document(cfg: ServeConfig) -> dict[str, Any]:
    """The config as the YAML document Serve reads: what was set, nothing Ray or we default (a new dict)."""
    return copy.deepcopy(cfg.model_dump(mode="json", exclude_unset=True))


def to_yaml(cfg: ServeConfig) -> str:
    return yaml.safe_dump(to_document(cfg), sort_keys=False)


def parse(document: Mapping[str, Any]) -> ServeConfig:
    """A Serve config document (as ``yaml.safe_load`` reads it) as a :class:`ServeConfig`; a ValueError naming
    the first key that would be lost or changed (Ray's schema drops keys it does not know)."""
    cfg = ServeConfig.model_validate(copy.deepcopy(dict(document)))
    lost = _first_difference(dict(document), to_document(cfg))
    if lost is not None:
        raise ValueError(f"the Serve config would not survive loading: {lost}")
    return cfg


def load(path: Path | str = SHIPPED_CONFIG) -> ServeConfig:
    """The Serve config file at ``path`` (default: the shipped ``serve_config.yaml``)."""
    return parse(yaml.safe_load(Path(path).read_text()) or {})


def write(cfg: ServeConfig, path: Path) -> Path:
    """Write ``cfg`` as YAML to ``path`` (what ``serve deploy`` then reads); ``path``."""
    path.write_text(to_yaml(cfg))
    return path


def _first_difference(given: Any, dumped: Any, where: str = "") -> str | None:
    if isinstance(given, dict) and isinstance(dumped, dict):
        for k in given:
            if k not in dumped:
                return f"{where}{k}: not a field of the schema (dropped)"
            found = _first_difference(given[k], dumped[k], f"{where}{k}.")
            if found:
                return found
        extra = sorted(set(dumped) - set(given))
        return f"{where}{extra[0]}: added" if extra else None
    if isinstance(given, list | tuple) and isinstance(dumped, list | tuple) and len(given) == len(dumped):
        for i, (a, b) in enumerate(zip(given, dumped, strict=True)):
            found = _first_difference(a, b, f"{where}{i}.")
            if found:
                return found
        return None
    if given != dumped or isinstance(given, bool) != isinstance(dumped, bool):
        return f"{where.rstrip('.')}: {given!r} became {dumped!r}"
    return None


# ----------------------------------------------------------------------------- reading
def fuzz_applications(cfg: ServeConfig) -> list[Application]:
    """The applications this project's builder builds."""
    return [a for a in cfg.applications if a.import_path == BUILDER]


def application(cfg: ServeConfig, name: str | None = None) -> Application:
    """The application named ``name``; without a name, the only (or first) one."""
    if name is None:
        if not cfg.applications:
            raise ValueError("the Serve config has no applications")
        return cfg.applications[0]
    for a in cfg.applications:
        if a.name == name:
            return a
    raise KeyError(f"no application {name!r} in the Serve config (it has {[a.name for a in cfg.applications]})")


def first_llm(cfg: ServeConfig) -> LLMSpec:
    """The first application's first LLM config (the benchmarks measure a single-model config)."""
    return application(cfg).fuzz_args.llm_configs[0]


def http_port(cfg: ServeConfig) -> int:
    """Serve's HTTP port (HAProxy's, or its proxy's) the config deploys on."""
    return cfg.http_options.port


def engine_deployment_names(cfg: ServeConfig) -> list[str]:
    """Serve's name of every engine deployment the config's applications build (``LLMServer:<model id>``)."""
    return [
        ENGINE_DEPLOYMENT_PREFIX + str(llm.model_id) for a in fuzz_applications(cfg) for llm in a.fuzz_args.llm_configs
    ]


def request_router_kwarg(cfg: ServeConfig, key: str) -> Any:
    """``key`` of the first engine deployment's ``request_router_kwargs`` that sets it; None where none does."""
    for a in fuzz_applications(cfg):
        for llm in a.fuzz_args.llm_configs:
            kwargs = (llm.deployment_config.request_router_config or {}).get("request_router_kwargs") or {}
            if key in kwargs:
                return kwargs[key]
    return None


# ----------------------------------------------------------------------------- changes (pure)
def replaced(model: M, **changes: Any) -> M:
    """``model`` with ``changes``, validated as a new model of its type (``model_copy`` would not validate: a
    misspelt router or a negative replica count must fail here, not at ``serve deploy``). What was set stays set
    and the changed fields become set, so :func:`to_document` writes exactly what the file had plus the changes."""
    data = {k: getattr(model, k) for k in model.model_fields_set}
    data.update(model.model_extra or {})
    data.update(changes)
    return type(model).model_validate(data)


def _with_apps(cfg: ServeConfig, change: Callable[[Application], Application]) -> ServeConfig:
    """``cfg`` with ``change`` applied to each of this builder's applications (the others as they are)."""
    return replaced(cfg, applications=[change(a) if a.import_path == BUILDER else a for a in cfg.applications])


def _with_args(app: Application, **changes: Any) -> Application:
    return replaced(app, args=replaced(app.fuzz_args, **changes))


def _with_llms(app: Application, change: Callable[[LLMSpec], LLMSpec]) -> Application:
    return _with_args(app, llm_configs=tuple(change(llm) for llm in app.fuzz_args.llm_configs))


def with_engine_kwargs(cfg: ServeConfig, change: Callable[[dict[str, Any]], dict[str, Any]]) -> ServeConfig:
    """Every engine's ``engine_kwargs`` replaced by ``change(a copy of them)`` (a scenario's
    ``engine_overrides``: faults, KV pool size, batch size)."""
    return _with_apps(
        cfg,
        lambda a: _with_llms(a, lambda llm: replaced(llm, engine_kwargs=change(copy.deepcopy(llm.engine_kwargs)))),
    )


def with_engine_kwargs_merged(cfg: ServeConfig, engine_kwargs: Mapping[str, Any]) -> ServeConfig:
    """Every engine's ``engine_kwargs`` with ``engine_kwargs`` merged in (a key given replaces its value)."""
    return with_engine_kwargs(cfg, lambda kw: {**kw, **copy.deepcopy(dict(engine_kwargs))})


def without_engine_kwargs(cfg: ServeConfig, keys: Iterable[str]) -> ServeConfig:
    """Every engine's ``engine_kwargs`` without ``keys`` (e.g. KV offloading removed)."""
    drop = frozenset(keys)
    return with_engine_kwargs(cfg, lambda kw: {k: v for k, v in kw.items() if k not in drop})


def with_allowed_xargs(cfg: ServeConfig, keys: Iterable[str]) -> ServeConfig:
    """The guard's ``xargs.allowed_extra_keys`` with ``keys`` appended (those not already there, in order)."""
    keys = tuple(keys)
    if not keys:
        return cfg

    def allow(a: Application) -> Application:
        guard = a.fuzz_args.guard
        have = guard.xargs.allowed_extra_keys
        xargs = replaced(guard.xargs, allowed_extra_keys=(*have, *(k for k in dict.fromkeys(keys) if k not in have)))
        return _with_args(a, guard=replaced(guard, xargs=xargs))

    return _with_apps(cfg, allow)


def redeployed(cfg: ServeConfig, engine_kwargs: Mapping[str, Any], allow_xargs: Iterable[str] = ()) -> ServeConfig:
    """``cfg`` as a redeploy changes it: engine settings merged in (any change under ``args`` makes Serve replace
    every replica) and vllm_xargs keys the guard allows from then on."""
    return with_allowed_xargs(with_engine_kwargs_merged(cfg, engine_kwargs), allow_xargs)


def with_routing(cfg: ServeConfig, routing: Routing | None) -> ServeConfig:
    """The engine deployments' request router (``routing:``); None keeps the config's."""
    return cfg if routing is None else _with_apps(cfg, lambda a: _with_args(a, routing=routing))


def with_engine_replicas(cfg: ServeConfig, replicas: int | Literal["fit"] | None) -> ServeConfig:
    """``engine_replicas:`` (a number, ``fit``, or None: as each model's deployment_config says)."""
    return _with_apps(cfg, lambda a: _with_args(a, engine_replicas=replicas))


def with_autoscaling(cfg: ServeConfig, autoscaling: Mapping[str, Any]) -> ServeConfig:
    """Serve's autoscaler sizes every engine deployment (``autoscaling_config``), not ``engine_replicas``
    (which the builder refuses beside it: the replica count in one place)."""

    def autoscaled(llm: LLMSpec) -> LLMSpec:
        options = replaced(llm.deployment_config, autoscaling_config=copy.deepcopy(autoscaling))
        return replaced(llm, deployment_config=options)

    return _with_apps(with_engine_replicas(cfg, None), lambda a: _with_llms(a, autoscaled))


def with_request_router_kwargs(cfg: ServeConfig, router_kwargs: Mapping[str, Any]) -> ServeConfig:
    """Every engine deployment's request router, the one ``routing:`` names (the builder's default where the
    YAML names none, as Serve would build it), with these keyword arguments (``initialize_state``)."""

    def routed(a: Application) -> Application:
        router = {**ROUTERS[a.fuzz_args.routing], "request_router_kwargs": copy.deepcopy(dict(router_kwargs))}

        def set_router(llm: LLMSpec) -> LLMSpec:
            options = replaced(llm.deployment_config, request_router_config=copy.deepcopy(router))
            return replaced(llm, deployment_config=options)

        return _with_llms(a, set_router)

    return _with_apps(cfg, routed)


def scaled(cfg: ServeConfig, replicas: int) -> ServeConfig:
    """Every engine deployment's ``num_replicas`` overridden in the application's ``deployments:`` section: Serve
    applies it in place (the same number under ``args`` would restart every replica)."""

    def scale(a: Application) -> Application:
        deployments = list(a.deployments)
        for llm in a.fuzz_args.llm_configs:
            name = ENGINE_DEPLOYMENT_PREFIX + str(llm.model_id)
            at = next((i for i, d in enumerate(deployments) if d.name == name), None)
            if at is None:
                deployments.append(DeploymentSchema(name=name, num_replicas=replicas))
            else:
                deployments[at] = replaced(deployments[at], num_replicas=replicas)
        return replaced(a, deployments=deployments)

    return _with_apps(cfg, scale)


def with_http_port(cfg: ServeConfig, port: int | None) -> ServeConfig:
    """Serve's HTTP port moved to ``port`` (None: the config's). ``http_options`` is written either way, as
    the deploy always wrote it."""
    options = cfg.http_options if port is None else replaced(cfg.http_options, port=port)
    return replaced(cfg, http_options=options)


def with_head_only_proxy(cfg: ServeConfig) -> ServeConfig:
    """Serve's proxy on the head node only (several nodes on one host cannot share one HTTP port)."""
    return replaced(cfg, proxy_location=ProxyLocation.HeadOnly)


def with_builder_args(cfg: ServeConfig, overrides: Mapping[str, Any]) -> ServeConfig:
    """Every application's builder arguments with ``overrides`` merged in, dicts recursively (as Serve merges
    deployment options); the result validated as :class:`FuzzServeArgs`."""
    if not overrides:
        return cfg

    def merged(a: Application) -> Application:
        args = deep_merged(a.fuzz_args.model_dump(mode="json", exclude_unset=True), overrides)
        return replaced(a, args=FuzzServeArgs.model_validate(args))

    return _with_apps(cfg, merged)


def with_env(cfg: ServeConfig, env: Mapping[str, str], app_name: str | None = None) -> ServeConfig:
    """``runtime_env.env_vars`` of every application (or of ``app_name``) with ``env`` added: what reaches the
    replicas' processes (e.g. ``FUZZSERVE_PATCHES_OFF`` for an A/B arm of one application)."""
    if not env:
        return cfg

    def add(a: Application) -> Application:
        if app_name is not None and a.name != app_name:
            return a
        runtime_env = copy.deepcopy(a.runtime_env or {})
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **dict(env)}
        return replaced(a, runtime_env=runtime_env)

    return replaced(cfg, applications=[add(a) for a in cfg.applications])


def with_applications(cfg: ServeConfig, apps: Iterable[Application]) -> ServeConfig:
    """``cfg``'s cluster-wide settings with these applications instead of its own (validated: Serve refuses two
    applications on one route or with one name)."""
    return replaced(cfg, applications=list(apps))


def only_applications(cfg: ServeConfig, names: Iterable[str]) -> ServeConfig:
    """``cfg`` with only the applications named (the rest dropped)."""
    keep = set(names)
    return replaced(cfg, applications=[a for a in cfg.applications if a.name in keep])


def renamed(app: Application, name: str, route_prefix: str | None = None) -> Application:
    """``app`` under another name, at ``route_prefix`` (default ``/<name>``)."""
    return replaced(app, name=name, route_prefix=route_prefix or f"/{name}")


def ingress_deployment_options(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The ingress deployment's Serve options (``ingress: router``): ``ray.serve.llm``'s defaults with the
    YAML's ``ingress_deployment_config`` merged in; a ``num_replicas`` there replaces the defaults' autoscaling
    (Serve refuses both)."""
    options = copy.deepcopy(dict(defaults))
    if "num_replicas" in overrides:
        options.pop("autoscaling_config", None)
    return deep_merged(options, overrides)


def deep_merged(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` merged into a copy of ``base``, dicts recursively (as Serve merges deployment options)."""
    out = copy.deepcopy(dict(base))
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merged(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
