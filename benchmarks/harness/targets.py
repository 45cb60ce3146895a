"""The serving stacks ``serve_stack`` measures: one table, from which phases, labels and Serve configs derive.

Each :class:`StackTarget` names the phase (its own Ray cluster) it is measured in,
a label, and the application arguments that make it what it is, so a
comparison between two targets is a comparison between two rows that differ
in the settings they name (tests/test_benchmarks.py checks the A/B pairs).
``a`` (vLLM's own server, patches off) is the reference every target is
divided by, round by round; ``ceil`` is offline ``LLM.generate``.

``python -m benchmarks.serve_stack --list`` prints the table.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ray.serve.config import ProxyLocation
from ray.serve.schema import HTTPOptionsSchema

from patches.framework.switches import ALL, OFF_ENV
from patches.shm_wait import NAP_ENV
from serve_app.config import deploy_config
from serve_app.config.deploy_config import BUILDER, Application, ServeConfig
from serve_app.engine.cluster_env import HAPROXY
from serve_app.engine.engine_env import ENGINE_ENV

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = deploy_config.SHIPPED_CONFIG


class EngineKwargs(TypedDict, total=False):
    """The benchmarks' engine settings: vLLM engine arguments (``LLM(...)``, a Serve app's ``engine_kwargs``)."""

    dtype: str
    enforce_eager: bool
    max_model_len: int
    enable_prefix_caching: bool
    kv_offloading_size: float
    kv_offloading_backend: str


ENGINE: EngineKwargs = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "enable_prefix_caching": True}
OFFLOAD: EngineKwargs = {"kv_offloading_size": 0.25, "kv_offloading_backend": "native"}


# ----------------------------------------------------------------------------- the benchmarks' Serve configs
def to_document_app(app: Application) -> dict[str, Any]:
    """One application as its YAML entry (a new dict)."""
    return copy.deepcopy(app.model_dump(mode="json", exclude_unset=True))


def benchmark_app(
    cfg: ServeConfig,
    name: str,
    replicas: int,
    args: Mapping[str, Any] | None = None,
    engine_kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    logging_config: Mapping[str, Any] | None = None,
    router_kwargs: Mapping[str, Any] | None = None,
) -> Application:
    """The config's (single) application as a benchmark target: at route ``/<name>``, with ``replicas`` engine
    replicas and only the named overrides (builder arguments, engine settings, replica environment, Serve's
    logging, the request router's keyword arguments)."""
    if len(cfg.applications) != 1:
        raise ValueError(f"a benchmark target is a single-application config; this has {len(cfg.applications)}")
    one = ServeConfig(applications=[deploy_config.renamed(cfg.applications[0], name)])
    one = deploy_config.with_builder_args(deploy_config.with_engine_replicas(one, replicas), dict(args or {}))
    one = deploy_config.with_env(
        deploy_config.with_engine_kwargs_merged(one, dict(engine_kwargs or {})), dict(env or {})
    )
    if router_kwargs:
        one = deploy_config.with_request_router_kwargs(one, router_kwargs)
    [app] = one.applications
    return deploy_config.replaced(app, logging_config=dict(logging_config)) if logging_config else app


def benchmark_config(apps: Iterable[Application]) -> ServeConfig:
    """The benchmarks' clusters: these applications side by side behind one proxy on the head, on loopback port
    8000, with a request timeout long enough for their largest runs."""
    return ServeConfig(
        proxy_location=ProxyLocation.HeadOnly,
        http_options=HTTPOptionsSchema(host="127.0.0.1", port=8000, request_timeout_s=600),
        applications=list(apps),
    )


class AppArgs(TypedDict):
    """The keyword arguments of :func:`app` a target names (``stock`` always; the rest where not the default)."""

    stock: bool
    replicas: NotRequired[int]
    patches: NotRequired[bool]
    direct: NotRequired[bool]
    offload: NotRequired[bool | None]
    omp_bind: NotRequired[str | None]
    patches_off: NotRequired[str | None]
    cores_per_replica: NotRequired[int | None]
    user_code_thread: NotRequired[bool]
    access_log: NotRequired[bool]
    nap_s: NotRequired[float | None]


class ShippedOverrides(TypedDict, total=False):
    """The overrides of serve_config.yaml's application a target names (:func:`shipped_application`'s)."""

    args: dict[str, Any]
    engine_kwargs: dict[str, Any]
    env: dict[str, str]
    logging_config: dict[str, Any]
    router_kwargs: dict[str, Any]


@dataclass(frozen=True)
class StackTarget:
    name: str
    phase: str
    label: str
    app: AppArgs | None = field(default=None, hash=False)  # keyword arguments of app(); None: no Serve app
    shipped: ShippedOverrides | None = field(default=None, hash=False)  # shipped_app() overrides: serve_config.yaml
    drives: str | None = None  # the target whose application this one drives (d drives c's app with fuzz)
    fuzz: bool = False  # every request carries the load tests' fuzz mix

    @property
    def app_name(self) -> str:
        return self.drives or self.name


_DIRECT: AppArgs = {"direct": True, "stock": False}
TARGETS: tuple[StackTarget, ...] = (
    StackTarget("a", "-", "vLLM server, patches off"),
    # Serve's default path (a router deployment in front of the replicas)
    StackTarget("b", "offstack", "stock ray.serve.llm, 1 replica", {"stock": True, "patches": False}),
    StackTarget("c0", "offstack", "fuzzserve 1 replica, patches off", {"stock": False, "patches": False}),
    StackTarget(
        "c1", "offstack", "fuzzserve 1 replica, patches on, offloading off, s=0", {"stock": False, "offload": False}
    ),
    StackTarget(
        "c1s",
        "offstack",
        "as c1, shm_wait patch off (upstream spin)",
        {"stock": False, "offload": False, "patches_off": "shm_wait"},
    ),
    StackTarget("c", "onstack", "fuzzserve 1 replica, patches on, s=0", {"stock": False}),
    StackTarget("cb", "onstack", "as c, engine threads bound to core 0", {"stock": False, "omp_bind": "0"}),
    StackTarget("d", "onstack", "fuzzserve 1 replica, fuzz mix", drives="c", fuzz=True),
    StackTarget("e", "onstack", "fuzzserve 2 replicas, s=0", {"stock": False, "replicas": 2}),
    StackTarget(
        "c0b", "bound", "as c0, engine threads bound to core 0", {"stock": False, "patches": False, "omp_bind": "0"}
    ),
    StackTarget(
        "c1b", "bound", "as c1, engine threads bound to core 0", {"stock": False, "offload": False, "omp_bind": "0"}
    ),
    StackTarget(
        "eb",
        "bound",
        "as e, each replica's engine on its own core",
        {"stock": False, "replicas": 2, "cores_per_replica": 1},
    ),
    StackTarget(
        "e1",
        "two",
        "as eb (two replicas on the router path, each engine on its own core), alone",
        {"stock": False, "replicas": 2, "cores_per_replica": 1},
    ),
    StackTarget(
        "e1s",
        "twospin",
        "as e1 with shm_wait off (upstream spin), alone",
        {"stock": False, "replicas": 2, "cores_per_replica": 1, "patches_off": "shm_wait"},
    ),
    # Ray's direct streaming (HAProxy forwards each request straight to a replica)
    StackTarget(
        "bd",
        "direct",
        "stock ray.serve.llm, direct streaming + HAProxy",
        {"stock": True, "patches": False, "direct": True},
    ),
    StackTarget("f0", "direct", "fuzzserve direct (guard in replica), patches off", {**_DIRECT, "patches": False}),
    StackTarget("f", "direct", "fuzzserve direct (guard in replica), patches on, s=0", _DIRECT),
    StackTarget("fb", "direct", "as f, engine threads bound to core 0", {**_DIRECT, "omp_bind": "0"}),
    StackTarget(
        "fbs",
        "direct",
        "as fb, shm_wait patch off (upstream spin)",
        {**_DIRECT, "omp_bind": "0", "patches_off": "shm_wait"},
    ),
    StackTarget("fbr", "levers", "as fb (the levers phase's control)", {**_DIRECT, "omp_bind": "0"}),
    StackTarget(
        "fbt",
        "levers",
        "as fb, user code on the replica's main event loop",
        {**_DIRECT, "omp_bind": "0", "user_code_thread": False},
    ),
    StackTarget(
        "fbq",
        "levers",
        "as fbt, access log off",
        {**_DIRECT, "omp_bind": "0", "user_code_thread": False, "access_log": False},
    ),
    StackTarget("fbn", "levers", "as fb, shm_wait nap 50 us", {**_DIRECT, "omp_bind": "0", "nap_s": 0.00005}),
    StackTarget(
        "fbc",
        "levers",
        "as f, engine_cores_per_replica 1 (EngineCore on the engine's core too)",
        {**_DIRECT, "cores_per_replica": 1},
    ),
    StackTarget("fb1", "alone", "as fbc, the only application in its cluster", {**_DIRECT, "cores_per_replica": 1}),
    StackTarget(
        "fb1s",
        "alonespin",
        "as fb1 with shm_wait off (upstream spin), alone",
        {**_DIRECT, "cores_per_replica": 1, "patches_off": "shm_wait"},
    ),
    StackTarget(
        "fb1n",
        "alonenap",
        "as fb1 with a 50 us shm_wait nap, alone",
        {**_DIRECT, "cores_per_replica": 1, "nap_s": 0.00005},
    ),
    # what users deploy: serve_config.yaml itself, alone in its cluster, and the stacks it must beat
    StackTarget("S", "shipped", "serve_config.yaml with 2 replicas (direct, fuzz_affinity), alone", shipped={}),
    StackTarget(
        "Se",
        "shippedeager",
        "as S, eager (enforce_eager: true), alone",
        shipped={"engine_kwargs": {"enforce_eager": True}},
    ),
    StackTarget(
        "Sw",
        "shippedworker",
        "as S with cpu_inproc off (the model in a worker process, as upstream), alone",
        shipped={"env": {OFF_ENV: "cpu_inproc"}},
    ),
    StackTarget(
        "Ss", "shippedspin", "as S with shm_wait off (upstream spin), alone", shipped={"args": {"shm_wait": False}}
    ),
    StackTarget(
        "Sr",
        "shippedrouter",
        "as S on the router path (ingress: router), alone",
        shipped={"args": {"ingress": "router"}},
    ),
    StackTarget(
        "St",
        "shippedthread",
        "as S with Serve's user-code thread (Ray's default; S runs the app on the replica's main loop), alone",
        shipped={"env": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1"}},
    ),
    StackTarget(
        "Sa",
        "shippedaccess",
        "as S with Serve's access log on (Ray's default; serve_config.yaml ships it off), alone",
        shipped={"logging_config": {"enable_access_log": True}},
    ),
    StackTarget(
        "Sb",
        "shippedbalance",
        "as S with fuzz_affinity's imbalanced_threshold 4 (8 shipped), alone",
        shipped={"router_kwargs": {"imbalanced_threshold": 4}},
    ),
    StackTarget(
        "So",
        "shippedopt",
        "as S with Ray Serve's RAY_SERVE_THROUGHPUT_OPTIMIZED=1 in the replicas, alone",
        shipped={"env": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}},
    ),
    StackTarget(
        "b2",
        "stock2",
        "stock ray.serve.llm, 2 replicas, default path, alone",
        {"stock": True, "patches": False, "replicas": 2},
    ),
    StackTarget(
        "bd2",
        "stockdirect2",
        "stock ray.serve.llm, 2 replicas, direct streaming + HAProxy, alone",
        {"stock": True, "patches": False, "replicas": 2, "direct": True},
    ),
    StackTarget("ceil", "ceiling", "offline LLM.generate"),
)
BY_NAME = {t.name: t for t in TARGETS}
LABELS = {t.name: t.label for t in TARGETS}
APP_OF = {t.name: t.app_name for t in TARGETS if t.drives}
PHASES: dict[str, tuple[str, ...]] = {}
for _t in TARGETS:
    if _t.app is not None or _t.shipped is not None or _t.drives:
        PHASES[_t.phase] = (*PHASES.get(_t.phase, ()), _t.name)


def llm_config(model: Path, replicas: int, offload: bool) -> dict[str, Any]:
    return {
        "model_loading_config": {"model_id": "fixture", "model_source": str(model)},
        "accelerator_config": {"kind": "cpu"},
        "deployment_config": {"autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas}},
        "engine_kwargs": {**ENGINE, **(OFFLOAD if offload else {})},
    }


def app(
    name: str,
    model: Path,
    *,
    stock: bool,
    replicas: int = 1,
    patches: bool = True,
    direct: bool = False,
    offload: bool | None = None,
    omp_bind: str | None = None,
    patches_off: str | None = None,
    cores_per_replica: int | None = None,
    user_code_thread: bool = True,
    access_log: bool = True,
    nap_s: float | None = None,
) -> Application:
    """One Serve application of a phase, at route ``/<name>``."""
    env = dict(ENGINE_ENV)
    if nap_s is not None:
        env[NAP_ENV] = str(nap_s)
    if not user_code_thread:
        env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0"
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    if not patches:
        env[OFF_ENV] = ALL
    elif patches_off:
        env[OFF_ENV] = patches_off
    if direct and stock:
        env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] = "1"
    cfg = llm_config(model, replicas, offload=patches if offload is None else offload)
    if stock:
        return Application(
            name=name,
            route_prefix=f"/{name}",
            import_path="ray.serve.llm:build_openai_app",
            runtime_env={"env_vars": env},
            args={"llm_configs": [cfg]},
        )
    args = deploy_config.FuzzServeArgs.model_validate(
        {
            "llm_configs": [cfg],
            "guard": {"api_keys_env": None},
            "ingress": "direct" if direct else "router",
            **({} if cores_per_replica is None else {"engine_cores_per_replica": cores_per_replica}),
        }
    )
    options: dict[str, Any] = {} if access_log else {"logging_config": {"enable_access_log": False}}
    return Application(
        name=name, route_prefix=f"/{name}", import_path=BUILDER, runtime_env={"env_vars": env}, args=args, **options
    )


# serve_stack and routing_hits run their stacks side by side in clusters of 32
# logical CPUs, where the shipped `engine_replicas: fit` would start 16: their
# targets pin the replica count they are about.
STACK_REPLICAS = 2


def shipped_application(
    name: str,
    args: dict[str, Any] | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    logging_config: dict[str, Any] | None = None,
    router_kwargs: dict[str, Any] | None = None,
    config: Path = SHIPPED_CONFIG,
    replicas: int = STACK_REPLICAS,
) -> Application:
    """serve_config.yaml's application, at route ``/<name>``, with ``replicas`` engine replicas and only the
    named overrides (:func:`benchmark_app`).

    ``router_kwargs``: the request router's keyword arguments (``initialize_state``), for the router the
    YAML's ``routing`` names.
    """
    return benchmark_app(
        deploy_config.load(config),
        name,
        replicas,
        args=args,
        engine_kwargs=engine_kwargs,
        env=env,
        logging_config=logging_config,
        router_kwargs=router_kwargs,
    )


def shipped_app(name: str, **overrides: Any) -> dict[str, Any]:
    """:func:`shipped_application` as its YAML entry."""
    return to_document_app(shipped_application(name, **overrides))


def is_direct(application: Application | Mapping[str, Any]) -> bool:
    """Whether the application is on Ray's direct-streaming path (our builder's ``ingress: direct``, or a stock
    app with Ray's switch in its environment)."""
    a = application if isinstance(application, Application) else Application.model_validate(dict(application))
    if a.import_path == BUILDER:
        return a.fuzz_args.ingress == "direct"
    return a.env_vars.get("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING") == "1"


def phase_serve_config(phase: str, model: Path) -> tuple[ServeConfig, dict[str, str], dict[str, str]]:
    """(serve config, target -> route prefix, cluster env) of a phase.

    The cluster runs Serve's HAProxy exactly when one of the phase's
    applications is on the direct path: a phase of router-path targets alone
    runs them on Serve's Python proxy, as a cluster without HAProxy does.
    """
    mine = [BY_NAME[n] for n in PHASES[phase]]
    apps = [
        app(t.name, model, **t.app) if t.app is not None else shipped_application(t.name, **(t.shipped or {}))
        for t in mine
        if not t.drives
    ]
    routes = {a.name: str(a.route_prefix) for a in apps}
    routes.update({t.name: routes[t.drives] for t in mine if t.drives})
    direct = any(is_direct(a) for a in apps)
    env = {HAPROXY: "1" if direct else "0"}
    return benchmark_config(apps), routes, env


def phase_config(phase: str, model: Path) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """:func:`phase_serve_config` with the config as its YAML document."""
    cfg, routes, env = phase_serve_config(phase, model)
    return deploy_config.to_document(cfg), routes, env


def table_markdown() -> str:
    lines = ["| target | phase | what |", "|---|---|---|"]
    lines += [f"| {t.name} | {t.phase} | {t.label} |" for t in TARGETS]
    return "\n".join(lines)
