"""A local Ray cluster on this machine, started and stopped by id, with the app deployed from YAML.

Used by the main job, the tests and the benchmarks. Why it lives here, in
the load tests' ``operate`` layer: the shipped load-test CLI deploys locally
with it (``load_tests.operate.deploy``), so it is shipped code and cannot be
in ``testkit`` (test rigs, which shipped packages never import); and it is no
part of the Serve application itself, which ``serve_app`` is (the app's
builder runs inside Serve, never starts a cluster). It imports only
``serve_app`` (the cluster environment, Serve's names, the typed config,
and on first use the private Ray method that makes ``serve status``'s
status, registered in ``serve_app.ray_internals``), nothing of the load
tests above ``operate``. It drives the same
commands a person would type (``ray start``, ``serve deploy``, ``serve
shutdown``), so what is tested is what README tells users to run; what it
asks of the cluster while waiting (``serve status``, ``ray list``) it asks
the dashboard's HTTP API those commands call, in this process: each command
is a Python process importing Ray, ~3 s of CPU, and a deploy polls every few
seconds on the cores its replicas are starting on. It cleans up only what it
started:

* each node is one ``ray start --block`` process in its own session; every
  process of the node (GCS, raylet, dashboard, workers, Serve replicas, vLLM
  EngineCore, and worker processes where there are any) is its descendant;
* :meth:`LocalCluster.close` first shuts Serve down (replicas drain and stop
  their engines), then interrupts each ``ray start --block`` (Ray's own
  shutdown), then SIGKILLs, by pid, whatever of the descendants recorded
  before the shutdown is still alive.

Several nodes on one machine (``workers=1``) need their own ports, which are
all picked here; the Serve HTTP proxy then runs on the head only
(``proxy_location: HeadOnly``), as two proxies cannot share one port.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from load_tests.operate.ports import free_port
from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig
from serve_app.config.names import ENGINE_REPLICA_CLASS, REPLICA_CLASS_PREFIX
from serve_app.engine.cluster_env import BIN, SINGLE_HOST, auth_headers, prepare_node, ray_root, with_cluster_env

log = logging.getLogger("fuzzserve.local_cluster")

REPO = deploy_config.PROJECT_ROOT
DEFAULT_CONFIG = deploy_config.SHIPPED_CONFIG


# Ray's switch for usage stats, read by every process (ray/_common/usage/usage_constants.py).
USAGE_STATS = "RAY_USAGE_STATS_ENABLED"


class ClusterError(RuntimeError):
    pass


@dataclass
class RayNode:
    """One ``ray start --block`` process (head or worker) and the ports it was given."""

    name: str
    argv: list[str]
    metrics_port: int
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    _log: Any = None

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while the process runs, closed by stop()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def process(self) -> subprocess.Popen:
        """The ``ray start`` process (an AttributeError before :meth:`start`, as ``proc.pid`` of None raised)."""
        if self.proc is None:
            raise AttributeError(f"Ray node {self.name} was not started")
        return self.proc

    def descendants(self) -> list[psutil.Process]:
        if not self.alive():
            return []
        try:
            return psutil.Process(self.process().pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def log_tail(self, lines: int = 40) -> str:
        """The end of this node's ``ray start`` output: when a Ray subprocess dies,
        ``ray start --block`` writes which one, its exit code and its own log's tail there."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"(log unreadable: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def metrics_up(self) -> bool:
        try:
            return httpx.get(self.metrics_url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def stop(self, timeout: float = 60) -> None:
        """SIGINT to ``ray start --block``, whose exit hook stops the node's processes; what is left after
        ``timeout`` is killed by pid."""
        if self.proc is None:
            return
        procs = self.descendants()
        if self.alive():
            # SIGINT: `ray start --block` exits through its atexit hook, which
            # stops the node's processes; SIGTERM would skip that hook.
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _gone, alive = psutil.wait_procs(procs, timeout=10)
        for p in alive:  # by pid: only processes this node started
            try:
                log.warning("killing leftover process %d (%s) of Ray node %s", p.pid, p.name(), self.name)
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        if self._log:
            self._log.close()


@dataclass
class LocalCluster:
    """Start with :meth:`start`; always :meth:`close` (or use as a context manager).

    ``num_cpus`` are *logical* CPUs per node: Ray's scheduling units, not cores;
    None leaves them to Ray (the host's cores), as a plain ``ray start`` does.
    ``env`` reaches every Ray process of the cluster, so it is how to set
    ``FUZZSERVE_API_KEYS``, ``FUZZSERVE_PATCHES_OFF`` or Serve's switches.
    """

    workers: int = 0
    # Several nodes (worker nodes now or added later): Ray refuses worker nodes under its single-host switch, and
    # a loopback-only head is out of their reach, so every node then runs without it (docs/security.md).
    multi_node: bool = False
    num_cpus: int | None = 8
    worker_num_cpus: int | None = 4
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    nodes: list[RayNode] = field(default_factory=list)
    dashboard_port: int = 0
    gcs_port: int = 0
    http_port: int = 0
    deployed_config: ServeConfig | None = None  # the last config deploy()/apply() sent
    session_dir: Path | None = None  # the head's Ray session directory (its logs/: Serve's controller log)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ nodes
    def _env(self) -> dict[str, str]:
        # Every node's environment as scripts/env.sh sets it for `ray start`
        # (serve_app.engine.cluster_env); env={"RAY_SERVE_ENABLE_HA_PROXY": "0"} opts out of one.
        # (token auth included: the CLI and the cluster must agree on it).
        env = with_cluster_env({**os.environ, **self.env})
        # Usage stats off on every node, as `--disable-usage-stats` means: Ray sets this variable for the head's
        # processes only (ray/scripts/scripts.py, `if head:`), so a worker node's replicas read usage stats as on,
        # and their engine start created ray.serve.llm's telemetry actor (serve_app.ray_internals,
        # llm_usage_telemetry_wanted). A value given here or in the environment wins.
        env.setdefault(USAGE_STATS, "0")
        if self.workers or self.multi_node:
            env[SINGLE_HOST] = "1"
        env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
        return env

    def _logs(self) -> Path:
        """The log directory, which :meth:`start` sets (a TypeError before, as ``None / name`` raised)."""
        if self.log_dir is None:
            raise TypeError("the cluster's log directory is set by start()")
        return self.log_dir

    def start(self, timeout: float = 180) -> LocalCluster:
        prepare_node(self._env())
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="fuzzserve-cluster-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        try:
            self._add_node(
                "head",
                [
                    "--head",
                    "--port",
                    str(self.gcs_port),
                    *_cpus(self.num_cpus),
                    "--dashboard-host",
                    "127.0.0.1",
                    "--dashboard-port",
                    str(self.dashboard_port),
                    "--ray-client-server-port",
                    str(free_port()),
                    "--include-dashboard",
                    "true",
                ],
            )
            self._wait(lambda: self._dashboard_up(), timeout, "the head node's dashboard")
            for i in range(self.workers):
                self._add_node(
                    f"worker{i + 1}", ["--address", f"127.0.0.1:{self.gcs_port}", *_cpus(self.worker_num_cpus)]
                )
            self._wait(lambda: len(self.alive_nodes()) == 1 + self.workers, timeout, f"{1 + self.workers} alive nodes")
            # A node counts as ALIVE as soon as its raylet registers; its agents
            # (which serve the metrics port) may still fail to start and take
            # the node down. Fail here, not minutes later in a deploy.
            self._wait(lambda: all(n.metrics_up() for n in self.nodes), timeout, "every node's metrics endpoint")
            latest = ray_root(self._env()) / "session_latest"
            self.session_dir = latest.resolve() if latest.exists() else None
        except BaseException:
            self.close()
            raise
        return self

    def add_worker(self, num_cpus: int | None = None, timeout: float = 180) -> RayNode:
        """Start one more worker node (e.g. spare capacity after a deploy) and wait until it is alive and exporting.

        Only on a cluster started with several nodes in mind (``workers`` or ``multi_node``): a single-host one
        binds its head on loopback, where no worker node can join."""
        if not (self.workers or self.multi_node):
            raise ClusterError("add_worker: this cluster was started as a single host (LocalCluster(multi_node=True))")
        node = self._add_node(f"worker{len(self.nodes)}", ["--address", f"127.0.0.1:{self.gcs_port}", *_cpus(num_cpus)])
        self._wait(lambda: len(self.alive_nodes()) == len(self.nodes), timeout, f"{len(self.nodes)} alive nodes")
        self._wait(node.metrics_up, timeout, f"{node.name}'s metrics endpoint")
        return node

    def _add_node(self, name: str, args: list[str]) -> RayNode:
        metrics = free_port()
        argv = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--metrics-export-port",
            str(metrics),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--dashboard-agent-grpc-port",
            str(free_port()),
            "--runtime-env-agent-port",
            str(free_port()),
            *args,
        ]
        node = RayNode(name, argv, metrics, self._logs() / f"ray-{name}.log", self._env())
        self.nodes.append(node)
        node.start()
        return node

    def _wait(self, ready, timeout: float, what: str, interval: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for node in self.nodes:
                if not node.alive():
                    raise ClusterError(
                        f"Ray node {node.name} exited (code {node.process().returncode}) while waiting for "
                        f"{what}; log: {node.log_path}; its end:\n{node.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.log_dir}")
            time.sleep(interval)

    def _dashboard_up(self) -> bool:
        try:
            return httpx.get(f"{self.dashboard_url}/api/version", timeout=5).status_code in (200, 401, 403)
        except httpx.HTTPError:
            return False

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def base_url(self) -> str:
        """The app's public HTTP address (Serve's HTTP port: its proxy, or HAProxy on the direct path)."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_urls(self) -> list[str]:
        """Ray's metrics export endpoint of every node."""
        return [n.metrics_url for n in self.nodes]

    # ------------------------------------------------------------- CLI calls
    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """Run a ``ray``/``serve`` command against this cluster; return its stdout."""
        tool, *rest = args
        address = self.dashboard_url if tool == "serve" or rest[:1] in (["list"], ["get"]) else None
        argv = [str(BIN / tool), *rest, *(["--address", address] if address else [])]
        r = subprocess.run(argv, env=self._env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if check and r.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        return r.stdout

    def dashboard_json(self, path: str, params: dict[str, str] | None = None, timeout: float = 60) -> Any:
        """``GET`` one of the dashboard's HTTP APIs (token auth as Ray's CLI presents it); its JSON body.

        A refusal or a body that is not JSON raises :class:`ClusterError`; a connection that fails or times out,
        ``httpx``'s errors (both in :data:`QUERY_ERRORS`)."""
        r = httpx.get(f"{self.dashboard_url}{path}", params=params, headers=auth_headers(self._env()), timeout=timeout)
        if r.status_code != 200:
            raise ClusterError(f"GET {path}: {r.status_code} {r.text[:2000]}")
        try:
            return r.json()
        except ValueError as e:
            raise ClusterError(f"GET {path}: not JSON ({e}): {r.text[:2000]}") from None

    def _state_list(self, resource: str, alive_only: bool, detail: bool = False) -> list[dict[str, Any]]:
        """What ``ray list <resource> --format json [--filter state=ALIVE] [--detail]`` prints, from the state
        API it calls (``/api/v0/<resource>``)."""
        params = {"limit": "1000", "timeout": "30", "detail": str(detail).lower()}
        if alive_only:
            params |= {"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE"}
        body = self.dashboard_json(f"/api/v0/{resource}", params)
        if not body.get("result", False):
            raise ClusterError(f"ray list {resource}: {body.get('msg')!r}")
        return list(body["data"]["result"]["result"])

    def alive_nodes(self) -> list[dict[str, Any]]:
        try:
            return self._state_list("nodes", alive_only=True)
        except QUERY_ERRORS:
            return []

    def all_nodes(self) -> list[dict[str, Any]]:
        """Every node Ray knows, alive or dead (``state``: ALIVE / DEAD)."""
        return self._state_list("nodes", alive_only=False)

    def actors(self, class_name_prefix: str = REPLICA_CLASS_PREFIX) -> list[dict[str, Any]]:
        """Alive actors whose class name starts with ``class_name_prefix`` (Ray's state API)."""
        listed = self._state_list("actors", alive_only=True, detail=True)
        return [a for a in listed if a.get("class_name", "").startswith(class_name_prefix)]

    # ---------------------------------------------------------------- deploy
    def effective_config(
        self,
        config: Path | ServeConfig = DEFAULT_CONFIG,
        args: dict[str, Any] | None = None,
        http_port: int | None = None,
    ) -> ServeConfig:
        """The config (a YAML path or a loaded config) with the HTTP port and builder arguments overridden, and
        Serve's proxy on the head only where there are several nodes; remembers the HTTP port."""
        cfg = config if isinstance(config, ServeConfig) else deploy_config.load(config)
        cfg = deploy_config.with_http_port(cfg, http_port)
        self.http_port = deploy_config.http_port(cfg)
        if self.workers:
            cfg = deploy_config.with_head_only_proxy(cfg)
        return deploy_config.with_builder_args(cfg, args or {})

    def deploy(
        self,
        config: Path | ServeConfig = DEFAULT_CONFIG,
        args: dict[str, Any] | None = None,
        http_port: int | None = None,
        timeout: float = 900,
        wait_ready: bool = True,
    ) -> ServeConfig:
        """``serve deploy`` the config; wait until every application is RUNNING and (``wait_ready``) ``/ready``
        answers."""
        cfg = self.effective_config(config, args, http_port)
        self.apply(cfg, "effective")
        deadline = time.monotonic() + timeout
        self._wait(lambda: self._apps_running(), timeout, "the Serve applications to be RUNNING", interval=3)
        if wait_ready:
            self._wait(lambda: self._ready(), max(30.0, deadline - time.monotonic()), f"{self.base_url}/ready")
        return cfg

    def apply(self, cfg: ServeConfig, name: str) -> None:
        """``serve deploy`` the config ``cfg`` as it is (saved as ``serve_config.<name>.yaml`` in the log
        directory) and return at once: Serve rolls it out in the background."""
        path = deploy_config.write(cfg, self._logs() / f"serve_config.{name}.yaml")
        self.cli("serve", "deploy", str(path))
        self.deployed_config = cfg  # kept as sent: the config functions return new configs, never change one

    def wait_http(self, route_prefixes: Iterable[str], timeout: float = 300) -> None:
        """Wait until ``GET <prefix>/v1/models`` answers 200 for every prefix (apps without ``/ready``)."""

        def up() -> bool:
            try:
                return all(
                    httpx.get(f"{self.base_url}{p}/v1/models", timeout=15).status_code == 200 for p in route_prefixes
                )
            except httpx.HTTPError:
                return False

        self._wait(up, timeout, f"/v1/models of {', '.join(route_prefixes)}")

    def serve_status(self, timeout: float = 60) -> dict[str, Any]:
        """What ``serve status`` prints (applications, their deployments and replica states, the proxies), made
        the way it makes it: Serve's details from the dashboard, read by Ray's own schema."""
        from serve_app import ray_internals  # on first use: the CLI's start-up does not pay for Ray's LLM modules

        return ray_internals.serve_status(self.dashboard_json("/api/serve/applications/", timeout=timeout))

    def _apps_running(self) -> bool:
        try:
            apps = self.serve_status().get("applications") or {}
        except httpx.TimeoutException:
            # On a saturated 2-core host (replicas compiling, engines starting)
            # the dashboard can stall past the timeout; that is "not yet",
            # and the caller's own deadline still bounds the wait.
            log.warning("Serve's status did not come within 60 s; still waiting")
            return False
        failed = {name: a for name, a in apps.items() if a.get("status") in ("DEPLOY_FAILED", "UNHEALTHY")}
        if failed:
            raise ClusterError(
                f"Serve deployment failed: {json.dumps(failed, indent=1)[:4000]}; logs in {self.log_dir}"
            )
        return bool(apps) and all(a.get("status") == "RUNNING" for a in apps.values())

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/ready", timeout=15).status_code == 200
        except httpx.HTTPError:
            return False

    def replicas(self, class_name_prefix: str = ENGINE_REPLICA_CLASS) -> list[dict[str, Any]]:
        """Alive engine replicas of the shipped app: Ray actor records (``pid``, ``node_id``, ``name`` ...);
        :func:`serve_app.config.names.replica_id` reads Serve's ReplicaId from a ``name``."""
        return self.actors(class_name_prefix)

    # ---------------------------------------------------------------- close
    def close(self, graceful: bool = True) -> None:
        """Stop the cluster: ``serve shutdown`` (replicas drain and stop), then every node. ``graceful=False``
        kills each node's processes by pid at once instead (~5 s, not ~70 s with two engine replicas): for a
        cluster whose run is over and judged, as the load-test CLI's own and the test session's are."""
        if not graceful:
            self._kill_processes()
        elif any(n.alive() for n in self.nodes[:1]):
            try:
                self.cli("serve", "shutdown", "-y", timeout=120, check=False)
                self._wait_no_replicas(60)
            except QUERY_ERRORS as e:  # never let a failed graceful step skip the kills below
                log.warning("serve shutdown failed: %s: %s", type(e).__name__, e)
        for node in reversed(self.nodes):
            node.stop()
        self._forget_address()

    def _kill_processes(self) -> None:
        """SIGKILL every process the nodes started, by pid. First each is frozen (SIGSTOP), again for any that
        appeared meanwhile, until none does: a frozen process cannot fork, so nothing the cluster starts in
        reaction to the first deaths (a raylet restarting a worker, Serve's proxy restarting HAProxy) is born
        after the listing and outlives the cluster."""
        frozen: dict[int, psutil.Process] = {}
        for _ in range(20):
            new = [p for node in self.nodes for p in node.descendants() if p.pid not in frozen]
            if not new:
                break
            for p in new:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.suspend()
                frozen[p.pid] = p
        for p in frozen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        deadline = time.monotonic() + 10  # gone or a zombie (whose reaping is its new parent's business)
        while pids_alive(frozen) and time.monotonic() < deadline:
            time.sleep(0.1)

    def _forget_address(self) -> None:
        """Remove Ray's "current cluster" file if it still names this (now stopped) cluster.

        ``ray start`` writes it and a SIGINT-ed ``ray start --block`` leaves it
        behind; ``serve run`` and ``ray.init()`` would then wait forever for a
        GCS that is gone instead of starting a local cluster.
        """
        path = ray_root(self._env()) / "ray_current_cluster"
        try:
            if self.gcs_port and path.read_text().strip().endswith(f":{self.gcs_port}"):
                path.unlink()
        except OSError:
            pass

    def _wait_no_replicas(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not self.actors():
                    return
            except QUERY_ERRORS as e:  # the state API is gone with the cluster: nothing left to wait for
                log.info("listing the replicas failed while shutting down (%s: %s); not waiting", type(e).__name__, e)
                return
            time.sleep(2)


def _cpus(num_cpus: int | None) -> list[str]:
    return [] if num_cpus is None else ["--num-cpus", str(num_cpus)]


# What a query of the cluster's state can raise (a ``ray``/``serve`` command, or the dashboard API one calls, and
# the parsed answer): the command failed or timed out, or the API refused (ClusterError, TimeoutExpired), the
# connection failed or timed out (httpx.HTTPError), a command could not start (OSError), or an answer is not the
# JSON it should be (ValueError, json's and pydantic's included). Callers for whom a failed
# query is "no answer" catch these and nothing broader: any other exception is a bug and propagates.
QUERY_ERRORS: tuple[type[Exception], ...] = (
    ClusterError,
    subprocess.TimeoutExpired,
    httpx.HTTPError,
    OSError,
    ValueError,
)


def pids_alive(pids: Iterable[int]) -> list[int]:
    """The pids of ``pids`` still running (a zombie has stopped: only its parent's wait is left)."""
    return [p for p in pids if running(p)]


def running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone between the listing and the look
        return False
