"""The stacks the headline benchmark compares ("arms"), each started fresh for one phase and torn down after.

* ``plain``: vLLM's own OpenAI server with vLLM's defaults, every patch of
  ours off (``FUZZSERVE_PATCHES_OFF=all``), the same model, dtype and
  ``max_model_len`` as the shipped config, **alone on the host**: it refuses
  to start, and a run is void, while any Ray process is alive. What a user
  who weighs this project against vLLM would run.
* ``engine``: the same vLLM OpenAI server with our patches on and a
  replica's engine: every ``engine_kwargs`` of the config's model
  (offloading, prefix caching, compiled), its ``runtime_env`` variables (the
  KV pool), the engine's compute threads and EngineCore pinned to the cores
  a rank-0 replica gets (``engine_cores_per_replica``), the ``cpu_inproc``
  patch running the model inside EngineCore. No Ray: set against ``plain``
  it says what our engine features cost or gain; set against ``shipped``,
  what the Serve path (HAProxy, the replica's frontend, the guard, Ray's
  direct streaming) costs.
* ``shipped``: the config exactly as ``ray start`` + ``serve deploy`` runs
  it, in a fresh single-node cluster with Ray's own CPU count, the HTTP port
  moved to a free one, nothing else deployed.
* ``stock``: the peer a Ray user would pick instead: stock ``ray.serve.llm``
  (``build_openai_app``, one replica, Ray's direct streaming behind Serve's
  HAProxy), vLLM's defaults (only ``dtype`` and ``max_model_len`` from the
  config, as ``plain``), every patch of ours off, in a fresh single-node
  cluster with the project's cluster environment, nothing else deployed.
* ``engine-nooffload``, ``shipped-nooffload``: the same without KV
  offloading (``kv_offloading_*`` removed from the engine's arguments), for
  the reuse workload: what the offload tier itself buys.
* a variant of any arm: its name, then ``+NAME=VALUE`` for each environment
  variable its processes get on top (for an arm on Ray, ``ray start``'s and
  its application's ``runtime_env``, which would otherwise win in the
  replicas; the server's otherwise), e.g.
  ``shipped+RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=1``: how a lever is
  measured against the arm without it. Lower-case names are
  the arm's own options: ``pin=none`` (engine arms) leaves EngineCore's
  threads unpinned (only the compute threads are bound, by vLLM);
  ``pin=split`` also pins the API server's threads (engine arms), or every
  Ray process but EngineCore (shipped arms: HAProxy, the replica's
  frontend, Ray's own), to the cores the engine does not use (so none of
  them preempts the engine's core);
  ``config=PATH`` takes the arm's settings from another Serve config (a
  lever in the YAML measured against the shipped one);
  ``via=replica`` (shipped arms, one replica) sends the client to the engine
  replica's own HTTP port (Ray's direct ingress, 30000-31000 by default)
  instead of Serve's HAProxy: the same replica without HAProxy's hop, so
  ``shipped`` against it is what HAProxy costs.

Every arm exposes ``base_url`` and ``metrics_urls`` (the server's own
counters: :mod:`benchmarks.harness.server_counters`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import psutil

from benchmarks.harness.host import find_ray_processes, lingering_engines, ray_processes
from patches.framework.switches import ALL, OFF_ENV
from serve_app.config import deploy_config
from serve_app.config.deploy_config import LLMSpec, ServeConfig
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, ENGINE_REPLICA_CLASS, replica_class_prefix

if TYPE_CHECKING:
    from load_tests.operate.local_cluster import LocalCluster
    from testkit.server_process import ServerProcess

log = logging.getLogger("fuzzserve.benchmarks.arms")

MODEL_NAME = "fixture"
OFFLOAD_KEYS = ("kv_offloading_size", "kv_offloading_backend")
# What a plain server takes from the config: what changes the computation (and so must match), nothing else.
PLAIN_KEYS = ("dtype", "max_model_len")
ARMS = ("plain", "engine", "shipped", "stock", "engine-nooffload", "shipped-nooffload")
STOCK_APP = "stock"  # the stock arm's Serve application (its replicas' class names carry it)
STOCK_BUILDER = "ray.serve.llm:build_openai_app"
DIRECT_STREAMING = "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"  # ray.serve.llm's switch for its direct path
ARM_OPTIONS = (
    "pin",
    "config",
    "via",
)  # lower-case NAME=VALUE items of a variant: the arm's own options, not environment
VIA = ("haproxy", "replica")  # a shipped arm's client talks to Serve's HAProxy, or to the replica's own port


def slug(name: str) -> str:
    """An arm's name as a file name (variants carry '=', '/', '+')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


class ProtocolError(RuntimeError):
    """The measurement would not be the one the benchmark promises (e.g. Ray alive during a plain run)."""


def require_no_ray(what: str, find: Callable[[], list[str]] = ray_processes) -> None:
    """Raise :class:`ProtocolError` naming them if any Ray process is alive."""
    alive = find()
    if alive:
        raise ProtocolError(
            f"{what}: plain vLLM must be measured alone on the host, but Ray processes are alive "
            f"(stop them: `ray stop`, or `serve shutdown -y && ray stop`):\n  " + "\n  ".join(alive[:20])
        )


# ----------------------------------------------------------------------------- the config
def load_config(path: Path) -> ServeConfig:
    return deploy_config.load(path)


def model_config(config: ServeConfig) -> LLMSpec:
    """The (single) application's first LLM config."""
    return deploy_config.first_llm(config)


def without_offloading(config: ServeConfig) -> ServeConfig:
    """The config with KV offloading removed from every model's engine arguments (a new config)."""
    return deploy_config.without_engine_kwargs(config, OFFLOAD_KEYS)


def engine_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    """``engine_kwargs`` as vLLM's server flags (``True`` -> ``--x``, ``False`` -> ``--no-x``, dicts as JSON)."""
    argv: list[str] = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            argv += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return argv


def replica_engine_settings(config: ServeConfig, offload: bool = True) -> tuple[list[str], dict[str, str], int | None]:
    """What a rank-0 replica of the config's model runs: vLLM flags, environment, engine cores per replica."""
    if not offload:
        config = without_offloading(config)
    app = deploy_config.application(config)
    return engine_flags(model_config(config).engine_kwargs), app.env_vars, app.fuzz_args.engine_cores_per_replica


# ----------------------------------------------------------------------------- vLLM's server
class VllmServer:
    """vLLM's OpenAI server in a process group of its own, alone on the host (no Ray process alive)."""

    def __init__(
        self,
        name: str,
        model: Path,
        log_dir: Path,
        flags: list[str],
        env: dict[str, str],
        engine_cores: list[int] | None = None,
        find_ray: Callable[[], list[str]] = ray_processes,
    ):
        self.name, self.model, self.log_dir = name, model, log_dir
        self.flags, self.env, self.engine_cores, self._find_ray = flags, env, engine_cores, find_ray
        self.split_frontend = False  # pin=split: the API server on the cores the engine does not use
        self.server: ServerProcess | None = None
        self.replicas = 1
        self.base_url: str  # set when started
        self.metrics_urls: list[str]

    def __enter__(self) -> VllmServer:
        from load_tests.operate.ports import free_port
        from serve_app.engine.engine_env import ENGINE_ENV
        from testkit.server_process import ServerProcess

        require_no_ray(f"before starting {self.name}", self._find_ray)
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            MODEL_NAME,
            *self.flags,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        log.info("%s: %s", self.name, " ".join(argv[3:]))
        self.server = server = ServerProcess(
            argv,
            f"http://127.0.0.1:{port}/health",
            log_path=self.log_dir / f"{slug(self.name)}.log",
            env={**ENGINE_ENV, **self.env},
        )
        self.base_url = f"http://127.0.0.1:{port}"
        self.metrics_urls = [f"{self.base_url}/metrics"]
        if self.engine_cores is not None:
            from serve_app.engine.cpu_cores import pin_engine_cores, pin_threads

            pinned = pin_engine_cores(self.engine_cores, parent_pid=server.proc.pid)
            if not pinned:
                server.close()
                raise ProtocolError(
                    f"{self.name}: no EngineCore process under the server to pin to {self.engine_cores}"
                )
            log.info("%s: EngineCore %s pinned to cores %s", self.name, pinned, self.engine_cores)
            if self.split_frontend:
                try:
                    rest = other_cores(self.name, self.engine_cores)
                except ProtocolError:
                    server.close()
                    raise
                pin_threads(psutil.Process(server.proc.pid), rest)
                log.info("%s: the API server's threads pinned to cores %s", self.name, rest)
        return self

    def check(self, when: str) -> None:
        require_no_ray(when, self._find_ray)

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()


def plain_engine_kwargs(config: ServeConfig) -> dict[str, Any]:
    """What a reference (plain, stock) takes of the config's engine arguments: what changes the computation."""
    kwargs = model_config(config).engine_kwargs
    return {k: kwargs[k] for k in PLAIN_KEYS if k in kwargs}


def plain_vllm(
    config: ServeConfig, model: Path, log_dir: Path, find_ray: Callable[[], list[str]] = ray_processes
) -> VllmServer:
    """vLLM's defaults, every patch off; only the settings that change what is computed come from the config."""
    return VllmServer(
        "plain", model, log_dir, engine_flags(plain_engine_kwargs(config)), {OFF_ENV: ALL}, find_ray=find_ray
    )


def patched_vllm(
    config: ServeConfig,
    model: Path,
    log_dir: Path,
    offload: bool = True,
    find_ray: Callable[[], list[str]] = ray_processes,
) -> VllmServer:
    """A replica's engine (our patches, its engine arguments, environment and cores) behind vLLM's own server."""
    from serve_app.engine.cpu_cores import BIND_ENV, replica_cores

    flags, env, cores_per_replica = replica_engine_settings(config, offload)
    cores = None
    if cores_per_replica:
        cores, _ = replica_cores(0, cores_per_replica, sorted(os.sched_getaffinity(0)))
        env[BIND_ENV] = ",".join(map(str, cores))
    env[OFF_ENV] = os.environ.get(OFF_ENV, "")  # our patches on, unless the caller switched some off
    return VllmServer("engine" if offload else "engine-nooffload", model, log_dir, flags, env, cores, find_ray)


# ----------------------------------------------------------------------------- the shipped stack
class Shipped:
    """The config as ``ray start`` + ``serve deploy`` runs it, in a fresh single-node cluster."""

    def __init__(
        self,
        config: ServeConfig | Path,
        log_dir: Path,
        name: str = "shipped",
        env: dict[str, str] | None = None,
        via: str = "haproxy",
        split: bool = False,
        replica_class: str | None = None,
    ):
        if via not in VIA:
            raise ValueError(f"arm {name!r}: via={via}: known values {', '.join(VIA)}")
        self.config, self.log_dir, self.name, self.env, self.via = config, log_dir, name, env or {}, via
        self.split = split  # pin=split: every Ray process but EngineCore on the cores the engine does not use
        # None: our app, ready when its /ready answers; else another app's replicas (the stock peer), whose class
        # names start with this and which is ready when /v1/models answers
        self.ours = replica_class is None
        self.replica_class = replica_class or ENGINE_REPLICA_CLASS
        # set when started
        self.cluster: LocalCluster
        self.replicas: int
        self.base_url: str
        self.metrics_urls: list[str]

    def __enter__(self) -> Shipped:
        from load_tests.operate.local_cluster import LocalCluster
        from load_tests.operate.ports import free_port

        # num_cpus=None: Ray counts the host's cores, as a plain `ray start --head` does
        self.cluster = LocalCluster(num_cpus=None, log_dir=self.log_dir, env=dict(self.env))
        self.cluster.start()
        try:
            self.cluster.deploy(self.config, http_port=free_port(), wait_ready=self.ours)
            if not self.ours:
                self.cluster.wait_http([""])
            replicas = self.cluster.replicas(self.replica_class)
            self.replicas = len(replicas)
            self.base_url = (
                f"http://127.0.0.1:{self._replica_port(replicas)}" if self.via == "replica" else self.cluster.base_url
            )
            if self.split:
                self._split_from_engine()
        except BaseException:
            self.cluster.close()
            raise
        self.metrics_urls = self.cluster.metrics_urls
        return self

    def _replica_port(self, replicas: list[dict[str, Any]]) -> int:
        """The one engine replica's own HTTP port (Ray's direct ingress), read from its listening sockets.

        The port range is Serve's (``RAY_SERVE_DIRECT_INGRESS_{MIN,MAX}_HTTP_PORT``), read from its private
        constants module rather than copied: only this benchmark option needs it, never the shipped app."""
        from ray.serve._private.constants import (
            RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT,
            RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT,
        )

        if len(replicas) != 1:
            raise ProtocolError(f"{self.name}: via=replica needs exactly one engine replica, found {len(replicas)}")
        conns = psutil.Process(int(replicas[0]["pid"])).net_connections(kind="tcp")
        return direct_ingress_port(
            [(c.status, c.laddr.port) for c in conns],
            RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT,
            RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT,
        )

    def _split_from_engine(self) -> None:
        """Move every thread of every Ray process (HAProxy, the replica's frontend, Ray's own) off the cores the
        engine is pinned to; EngineCore keeps them. Processes Ray starts later inherit their parent's cores."""
        from serve_app.engine.cpu_cores import ENGINE_CORE_NAME, pin_threads

        engines = [p for p in psutil.process_iter() if p.name().startswith(ENGINE_CORE_NAME)]
        if len(engines) != 1:
            raise ProtocolError(f"{self.name}: pin=split needs exactly one EngineCore, found {len(engines)}")
        engine_cores = sorted(os.sched_getaffinity(engines[0].pid))
        rest = other_cores(self.name, engine_cores)
        moved = 0
        for proc, _ in find_ray_processes():
            if proc.pid == engines[0].pid:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                pin_threads(proc, rest)
                moved += 1
        log.info(
            "%s: %d Ray processes moved to cores %s; EngineCore %d keeps %s",
            self.name,
            moved,
            rest,
            engines[0].pid,
            engine_cores,
        )

    def check(self, when: str) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        self.cluster.close()
        left = ray_processes() + lingering_engines()
        if left:
            raise ProtocolError(f"the {self.name} phase's cluster left Ray processes behind:\n  " + "\n  ".join(left))


# An arm of the benchmark: started with ``with``, it serves at ``base_url`` and exports its counters at
# ``metrics_urls``; ``replicas``: its engine replicas; ``check(when)``: its protocol check around each run (a plain
# server's: no Ray process alive).
Arm: TypeAlias = VllmServer | Shipped


def stock_config(config: ServeConfig, model: Path) -> ServeConfig:
    """The stock peer's Serve config: ``build_openai_app`` at ``/``, one replica, vLLM's defaults but the
    settings that change what is computed (as ``plain``), Ray's direct streaming, every patch of ours off, and
    serve_config.yaml's HTTP options (loopback, its timeouts), so only the application differs."""
    from serve_app.engine.engine_env import ENGINE_ENV

    llm = {
        "model_loading_config": {"model_id": MODEL_NAME, "model_source": str(model)},
        "accelerator_config": {"kind": "cpu"},
        "deployment_config": {"num_replicas": 1},
        "engine_kwargs": plain_engine_kwargs(config),
    }
    app = deploy_config.Application(
        name=STOCK_APP,
        route_prefix="/",
        import_path=STOCK_BUILDER,
        runtime_env={"env_vars": {**ENGINE_ENV, OFF_ENV: ALL, DIRECT_STREAMING: "1"}},
        args={"llm_configs": [llm]},
    )
    return config.model_copy(update={"applications": [app]})


def other_cores(name: str, engine_cores: Collection[int]) -> list[int]:
    """The cores this process may use that the engine does not (``pin=split``); refused when there are none."""
    rest = sorted(set(os.sched_getaffinity(0)) - set(engine_cores))
    if not rest:
        raise ProtocolError(f"{name}: pin=split needs a core besides the engine's {sorted(engine_cores)}")
    return rest


def direct_ingress_port(listening: list[tuple[str, int]], low: int, high: int) -> int:
    """The one port in ``[low, high]`` among ``(status, port)`` sockets that is listening (a replica's HTTP)."""
    ports = sorted({port for status, port in listening if status == psutil.CONN_LISTEN and low <= port <= high})
    if len(ports) != 1:
        raise ProtocolError(f"expected one listening port in {low}-{high} on the replica, found {ports}")
    return ports[0]


def split_arms(text: str) -> list[str]:
    """``--arms``' comma-separated list, where a variant's value may hold commas itself
    (``plain,engine+FUZZSERVE_PATCHES_OFF=cpu_inproc,shm_wait``): a comma starts a new arm only before an
    arm's name."""
    bases = "|".join(re.escape(a) for a in sorted(ARMS, key=len, reverse=True))
    return [a for a in re.split(rf",(?=(?:{bases})(?:\+|,|$))", text) if a]


def parse_arm(name: str) -> tuple[str, dict[str, str]]:
    """``"shipped+A=1+B=2"`` -> ("shipped", {"A": "1", "B": "2"}); refuses an unknown base or a bad variable."""
    base, *extra = name.split("+")
    if base not in ARMS:
        raise ValueError(f"unknown arm {base!r}; known: {', '.join(ARMS)} (a variant: ARM+NAME=VALUE)")
    env = {}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"arm {name!r}: {item!r} is not NAME=VALUE")
        if key.islower() and key not in ARM_OPTIONS:
            raise ValueError(f"arm {name!r}: unknown option {key!r}; known: {', '.join(ARM_OPTIONS)}")
        env[key] = value
    return base, env


def make_arm(name: str, config: ServeConfig, model: Path, log_dir: Path) -> Arm:
    """A fresh arm by name (:data:`ARMS`, or a variant: ``ARM+NAME=VALUE...``), not yet started."""
    base, extra = parse_arm(name)
    log_dir.mkdir(parents=True, exist_ok=True)
    if "config" in extra:
        config = load_config(Path(extra.pop("config")))
    if base == "stock":
        unknown = sorted(k for k in extra if k in ARM_OPTIONS)
        if unknown:
            raise ValueError(f"arm {name!r}: the stock arm takes no option ({', '.join(unknown)})")
        return Shipped(
            deploy_config.with_env(stock_config(config, model), extra),
            log_dir,
            name,
            extra,
            replica_class=replica_class_prefix(STOCK_APP, ENGINE_DEPLOYMENT_PREFIX),
        )
    if base == "plain":
        arm = plain_vllm(config, model, log_dir)
    elif base in ("engine", "engine-nooffload"):
        arm = patched_vllm(config, model, log_dir, offload=base == "engine")
    else:
        via = extra.pop("via", "haproxy")
        pin = extra.pop("pin", None)
        if pin not in (None, "split"):
            raise ValueError(f"arm {name!r}: pin={pin}: a shipped arm knows only split")
        shipped = config if base == "shipped" else without_offloading(config)
        return Shipped(deploy_config.with_env(shipped, extra), log_dir, name, extra, via, split=pin == "split")
    if "via" in extra:
        raise ValueError(f"arm {name!r}: via is an option of shipped arms")
    options = {k: extra.pop(k) for k in list(extra) if k in ARM_OPTIONS}
    if options.get("pin") == "none":
        arm.engine_cores = None
    elif options.get("pin") == "split":
        arm.split_frontend = True
    elif "pin" in options:
        raise ValueError(f"arm {name!r}: pin={options['pin']}: known values none, split")
    arm.name = name
    arm.env.update(extra)
    return arm
