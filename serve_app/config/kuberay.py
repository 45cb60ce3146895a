"""KubeRay RayService manifests, generated from the Serve configs and the cluster's environment table.

Why generated: a RayService carries two things the project already keeps
elsewhere, the Serve config (``serveConfigV2``, a string holding
``serve_config.yaml`` or ``serve_config.cuda.yaml``) and the environment
every Ray node starts with (``scripts/env.sh`` exports
:data:`serve_app.engine.cluster_env.CLUSTER_ENV`). Written by hand they
drift; here both come from their one source, with what changes off a single
host written down beside each change (:data:`K8S_SERVE_CHANGES`,
:func:`env_rules`), and ``tests/test_kuberay.py`` fails when a committed
manifest differs from what this module writes.

    python -m serve_app.config.kuberay                 # rewrite deploy/rayservice.{cpu,cuda}.yaml
    python -m serve_app.config.kuberay --check         # exit 1 naming a manifest that drifted or fails the checks
    python -m serve_app.config.kuberay --target cpu --image REGISTRY/fuzzserve:TAG --out my.yaml
    python -m serve_app.config.kuberay --target cpu --serve-config mine.yaml --out my.yaml   # your own model
    python -m serve_app.config.kuberay --validate my.yaml  # the offline checks on a manifest you edited
    python -m serve_app.config.kuberay --check-image   # inside the image (deploy/Dockerfile): versions, paths

What a RayService here is (docs/kubernetes.md walks through it): a head
group holding no engine (``num-cpus: 0``, as KubeRay's own LLM samples),
one worker group with one engine replica per worker pod, sized as
``engine_replicas: fit`` counts a replica (its engine's cores + 1 for its
HTTP frontend: :func:`serve_app.app.fit_replicas`), the same environment on
every container, the API keys from a Kubernetes Secret, Ray's token
authentication through KubeRay's ``authOptions``, the probes KubeRay 1.7
would inject for Ray >= 2.53 written out, and the ports a multi-node
cluster uses named on the containers.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import yaml
from ray.serve.config import ProxyLocation

from serve_app.command_logs import command_logging
from serve_app.config import deploy_config as dc
from serve_app.config.kuberay_schema import check_manifest, documents
from serve_app.engine import cluster_env as ce
from serve_app.engine import engine_env as ee

DEPLOY = dc.PROJECT_ROOT / "deploy"
CONSTRAINTS = dc.PROJECT_ROOT / "constraints.txt"
GENERATOR = "python -m serve_app.config.kuberay"

# The image (deploy/Dockerfile): where the project lives in it, and the Ray version its base image carries.
IMAGE_PROJECT = "/home/ray/fuzzserve"
RAY_VERSION = "2.60.0"
# The Secret holding the guard's API keys (comma-separated, as FUZZSERVE_API_KEYS on a single host).
API_KEYS_SECRET = "fuzzserve-api-keys"
API_KEYS_SECRET_KEY = "keys"
API_KEYS_ENV = "FUZZSERVE_API_KEYS"
# Ports: Serve's HTTP port (KubeRay finds it by the name "serve"), Ray's metrics export port (what a Prometheus,
# the load tests' --metrics-url and the dashboard read), and the head's GCS, dashboard and Ray Client ports.
SERVE_PORT = 8000
METRICS_PORT = 8080
DASHBOARD_AGENT_PORT = 52365  # the dashboard agent's HTTP port: Ray's node health endpoint (/api/healthz)
HEAD_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
# Ray's ports between nodes that it would otherwise pick at random on every node (docs/security.md, "Ray's own
# ports"), pinned so that a NetworkPolicy or firewall can name each: rayStartParams flag -> (container port name,
# port). What stays a range: the workers' gRPC ports (Ray's --min/--max-worker-port, 10002-19999) and Serve's
# replicas' and ingress routers' own HTTP ports (30000-31000).
NODE_PORTS = {
    "metrics-export-port": ("metrics", METRICS_PORT),
    "dashboard-agent-listen-port": ("dashboard-agent", DASHBOARD_AGENT_PORT),
    "node-manager-port": ("raylet", 6380),
    "object-manager-port": ("object-manager", 8076),
    "dashboard-agent-grpc-port": ("agent-grpc", 8077),
    "runtime-env-agent-port": ("runtime-env", 8078),
}


# ----------------------------------------------------------------------------- what changes off one host
# Every change made to a Serve config for Kubernetes, with why (written into each manifest's header).
K8S_SERVE_CHANGES = (
    (
        "http_options.host: 0.0.0.0",
        (
            "the Serve Service reaches each pod at its own address, so Serve's HTTP listeners bind every interface "
            "of the pod; the guard then refuses to start without API keys (they come from the Secret)"
        ),
    ),
    (
        "proxy_location: EveryNode",
        (
            "KubeRay's Serve Service sends traffic to every pod whose proxy is ready, so each worker's HAProxy "
            "takes its share (HeadOnly would put every request through the head pod)"
        ),
    ),
    (
        "engine_replicas: the worker count",
        (
            "fit counts the nodes alive when the app is built, and KubeRay deploys the Serve config once the head "
            "answers, possibly before every worker has joined: a fixed count (one replica per worker pod, the "
            "worker sized so that fit would count exactly one) does not depend on that race"
        ),
    ),
)


@dataclass(frozen=True)
class EnvRule:
    """What a variable of :data:`CLUSTER_ENV <serve_app.engine.cluster_env.CLUSTER_ENV>` becomes in a pod:
    ``keep`` (the same value), ``image`` (set by the image, whose paths it names: deploy/Dockerfile's ENV),
    ``kuberay`` (set by KubeRay itself) or ``omit`` (not set; Ray's default applies), and why."""

    action: Literal["keep", "image", "kuberay", "omit"]
    why: str


_KEEP_WHY = {
    ce.HAPROXY: "Serve's HAProxy: the direct-streaming path that `ingress: direct` needs",
    ce.FORWARD_BODY: "HAProxy hands the body to the ingress request router: fuzz_affinity sees prompt and fuzz keys",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "Serve's controller reconciles every 0.5 s (less idle CPU: docs/serve.md)",
    "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE": "at most 64 KiB of a body reaches the router, "
    "which runs before any API key is checked (docs/security.md)",
    "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE": "two ingress request routers per proxy node: a redeploy "
    "never leaves HAProxy with only a stopping one",
    ce.HAPROXY_METRICS: "no per-request metrics line from HAProxy for Serve's proxy to parse: the engine "
    "replica counts serve_num_http_requests itself (docs/benchmarks.md#the-serve-paths-own-work)",
    ce.SHUTDOWN_TIER_TIMEOUT: "serve shutdown waits 5 s, not 30, for the routers' tier",
    ce.EDGE_CALLBACK: "every HTTP server Serve starts refuses the headers that lift Ray's request limits",
    "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "a client silent for 30 s is cut off (Serve's default: an hour)",
    ce.HARD_STOP_AFTER: "an old HAProxy process finishes its streams for 360 s after a reload (Serve's default: 120)",
    ee.HF_HUB_OFFLINE: "the fixture model is in the image: never look for a model hub",
    ee.KV_CACHE_SPACE: "GiB of KV cache per CPU engine (unset, vLLM takes ~92 % of the pod's free RAM)",
    ee.AOT_COMPILE: "vLLM 0.32's AOT compile cache never loads on CPU: Inductor's own cache serves restarts",
}
_SINGLE_HOST_FILES = (
    "single-host only: the 0700 private directory keeps Serve's HAProxy files (admin socket) and Ray's temp "
    "root from other users of a shared host; a pod's /tmp is its own container's (one user), and nothing "
    "would make the directory before KubeRay's `ray start`"
)
_CPU_ONLY = "CPU engines only"
_ACTION = {"image": "set by the image", "kuberay": "set by KubeRay", "omit": "not set"}


def env_rules(target: str) -> dict[str, EnvRule]:
    """Each :data:`CLUSTER_ENV <serve_app.engine.cluster_env.CLUSTER_ENV>` variable's fate in ``target``'s pods
    (``cpu`` or ``cuda``). Every variable of the table has a rule: :func:`cluster_env_for` refuses one without."""
    rules: dict[str, EnvRule] = {k: EnvRule("keep", why) for k, why in _KEEP_WHY.items()}
    rules[ce.AUTH_MODE] = EnvRule(
        "kuberay",
        "Ray's token authentication: KubeRay sets RAY_AUTH_MODE and RAY_AUTH_TOKEN on every container from "
        "authOptions.mode: token (a Secret it makes); set here without a token, `ray start` would refuse",
    )
    for name in (*ce.haproxy_env(Path("/")), ce.RAY_TMPDIR):
        rules[name] = EnvRule("omit", _SINGLE_HOST_FILES)
    for name in ("RAY_SERVE_HAPROXY_BINARY_PATH", "FUZZSERVE_HAPROXY_REAL"):
        rules[name] = EnvRule("image", "HAProxy through serve_app/ingress/haproxy_edge.sh: paths of the image")
    rules[ce.SINGLE_HOST] = EnvRule(
        "omit",
        "single-host only: Ray's loopback switch; pods reach each other at their own addresses, and Ray "
        "refuses worker nodes under it",
    )
    if target == "cuda":
        rules[ee.HF_HUB_OFFLINE] = EnvRule(
            "omit",
            "serve_config.cuda.yaml names a hub model: the pods download it (set it to 1 with a mounted model "
            "on a cluster without network access)",
        )
        rules[ee.KV_CACHE_SPACE] = EnvRule("omit", _CPU_ONLY)
        rules[ee.AOT_COMPILE] = EnvRule("omit", _CPU_ONLY + ": the AOT cache loads on CUDA")
    return rules


# Set by KubeRay's own high-throughput LLM sample on every container, deliberately not here.
NOT_FROM_THE_SAMPLE = {
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "ray.serve.llm's switch for build_openai_app's direct path; "
    "this project's builder builds its own (ingress: direct)",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "measured beside the shipped stack: within the run's scatter (1.09x and "
    "0.93x of the baseline where the shipped stack read 0.97x and 0.96x), so Serve's defaults stay "
    "(docs/results_log.md, serve_stack: Serve's switches)",
    "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "vLLM's Ray executor, for engines spanning several GPUs; these "
    "engines run on one device each",
}


def cluster_env_for(target: str, environ: Mapping[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """The variables a ``target`` pod sets: name -> (value, why), in :data:`CLUSTER_ENV`'s order, from the same
    table ``scripts/env.sh`` exports (``environ``: that table, for tests)."""
    table = ce.CLUSTER_ENV if environ is None else environ
    rules = env_rules(target)
    missing = sorted(set(table) - set(rules))
    if missing:
        raise ValueError(
            f"no Kubernetes rule for {', '.join(missing)} (serve_app/engine/cluster_env.py): say in "
            "serve_app/config/kuberay.py env_rules whether a pod keeps it, and why"
        )
    return {k: (v, rules[k].why) for k, v in table.items() if rules[k].action == "keep"}


# ----------------------------------------------------------------------------- the targets
@dataclass(frozen=True)
class Manifest:
    """One manifest: its Serve config, its image and the pods' sizes."""

    name: Literal["cpu", "cuda"]
    serve_config: Path
    image: str
    workers: int
    worker_resources: dict[str, str]
    worker_start_params: dict[str, str]
    head_resources: dict[str, str]

    @property
    def manifest(self) -> Path:
        return DEPLOY / f"rayservice.{self.name}.yaml"


_VERSION = "0.1.0"
TARGETS = {
    "cpu": Manifest(
        name="cpu",
        serve_config=dc.PROJECT_ROOT / "serve_config.yaml",
        image=f"fuzzserve:{_VERSION}-cpu",
        workers=2,
        # Ray's logical CPUs: 2 = engine_cores_per_replica (1) + the frontend (1), what fit counts per replica;
        # the container gets one more core for what runs beside the replica on every node (HAProxy, two
        # ingress request routers, Serve's proxy actor, the raylet and agents), which reserves no Ray CPU.
        worker_start_params={"num-cpus": "2"},
        # memory: the KV pool (VLLM_CPU_KVCACHE_SPACE, 1 GiB) + the offload tier (kv_offloading_size, 2 GiB,
        # taken as it fills) + EngineCore, the frontend, Ray's processes and /dev/shm's object store
        worker_resources={"cpu": "3", "memory": "8Gi"},
        head_resources={"cpu": "2", "memory": "6Gi"},
    ),
    "cuda": Manifest(
        name="cuda",
        serve_config=dc.PROJECT_ROOT / "serve_config.cuda.yaml",
        image=f"fuzzserve:{_VERSION}-cuda",
        workers=2,
        # Ray's CPUs and GPUs from the container's limits (KubeRay's default): one GPU, one engine replica.
        worker_start_params={},
        # memory: kv_offloading_size (16 GiB of host memory per replica) + the engine, frontend and Ray
        worker_resources={"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "1"},
        head_resources={"cpu": "2", "memory": "6Gi"},
    ),
}


# ----------------------------------------------------------------------------- the Serve config
def k8s_serve_config(cfg: dc.ServeConfig, workers: int) -> dc.ServeConfig:
    """``cfg`` as a RayService runs it (:data:`K8S_SERVE_CHANGES`): every other key as the file says."""
    out = dc.replaced(
        cfg, http_options=dc.replaced(cfg.http_options, host="0.0.0.0"), proxy_location=ProxyLocation.EveryNode
    )
    apps = []
    for app in out.applications:
        if app.import_path == dc.BUILDER and app.fuzz_args.engine_replicas is not None:
            app = dc.replaced(app, args=dc.replaced(app.fuzz_args, engine_replicas=workers))
        apps.append(app)
    return dc.with_applications(out, apps)


def serve_replicas(cfg: dc.ServeConfig) -> int:
    """Engine replicas the (Kubernetes) Serve config runs at most, over its models."""
    total = 0
    for app in dc.fuzz_applications(cfg):
        args = app.fuzz_args
        for llm in args.llm_configs:
            if isinstance(args.engine_replicas, int):
                total += args.engine_replicas
            else:
                most = llm.deployment_config.max_replicas()
                total += int(most) if most != float("inf") else 0
    return total


def drain_seconds(cfg: dc.ServeConfig) -> int:
    """The longest ``graceful_shutdown_timeout_s`` of the config's models (Serve's default: 20 s)."""
    longest = 20
    for app in dc.fuzz_applications(cfg):
        for llm in app.fuzz_args.llm_configs:
            extra = llm.deployment_config.model_extra or {}
            longest = max(longest, int(extra.get("graceful_shutdown_timeout_s", 20)))
    return longest


# ----------------------------------------------------------------------------- the manifest
def _probe(action: dict[str, Any], *, initial: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        **copy.deepcopy(action),  # never one object in two places: the dump would make it a YAML alias
        "initialDelaySeconds": initial,
        "timeoutSeconds": timeout,
        "periodSeconds": 5,
        "successThreshold": 1,
        "failureThreshold": failures,
    }


_NODE_HEALTH = {"httpGet": {"path": "/api/healthz", "port": DASHBOARD_AGENT_PORT}}
_WORKER_READY = {
    "exec": {
        "command": [
            "bash",
            "-c",
            (
                f"wget --tries 1 -T 2 -q -O- http://localhost:{DASHBOARD_AGENT_PORT}/api/local_raylet_healthz "
                f"| grep success && wget --tries 1 -T 10 -q -O- http://localhost:{SERVE_PORT}/-/healthz | grep success"
            ),
        ]
    }
}


def _container(name: str, image: str, env: list[dict[str, Any]], resources: dict[str, str], ports: dict[str, int]):
    return {
        "name": name,
        "image": image,
        "env": env,
        "ports": [{"containerPort": port, "name": pname, "protocol": "TCP"} for pname, port in ports.items()],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }


def manifest(target: Manifest, image: str | None = None, name: str | None = None) -> dict[str, Any]:
    """``target``'s RayService as a document (``image``, ``name``: another image or resource name)."""
    serve_cfg = k8s_serve_config(dc.load(target.serve_config), target.workers)
    replicas = serve_replicas(serve_cfg)
    if replicas != target.workers:
        raise ValueError(
            f"{target.serve_config.name} runs {replicas} engine replicas and the {target.name} manifest has "
            f"{target.workers} worker pods: one replica per worker"
        )
    image = image or target.image
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, (v, _) in cluster_env_for(target.name).items()]
    env.append(
        {"name": API_KEYS_ENV, "valueFrom": {"secretKeyRef": {"name": API_KEYS_SECRET, "key": API_KEYS_SECRET_KEY}}}
    )
    node_ports = dict(NODE_PORTS.values())
    node_params = {flag: str(port) for flag, (_, port) in NODE_PORTS.items()}
    head = _container("ray-head", image, env, target.head_resources, {**HEAD_PORTS, "serve": SERVE_PORT, **node_ports})
    # KubeRay 1.7's values (ray-operator/controllers/ray/common/pod.go, initLivenessAndReadinessProbe)
    head["livenessProbe"] = _probe(_NODE_HEALTH, initial=30, timeout=5, failures=120)
    head["readinessProbe"] = _probe(_NODE_HEALTH, initial=10, timeout=5, failures=10)
    worker = _container("ray-worker", image, env, target.worker_resources, {"serve": SERVE_PORT, **node_ports})
    worker["livenessProbe"] = _probe(_NODE_HEALTH, initial=30, timeout=2, failures=120)
    worker["readinessProbe"] = _probe(_WORKER_READY, initial=10, timeout=2, failures=1)
    grace = drain_seconds(serve_cfg) + 30
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name or f"fuzzserve-{target.name}", "labels": {"app.kubernetes.io/name": "fuzzserve"}},
        "spec": {
            "upgradeStrategy": {"type": "NewCluster"},
            # lists of numbers and small mappings on one line each (the histogram buckets)
            "serveConfigV2": yaml.safe_dump(
                dc.to_document(serve_cfg), sort_keys=False, default_flow_style=None, width=110
            ),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "authOptions": {"mode": "token"},
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0", **node_params},
                    "template": {"spec": {"containers": [head]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "engines",
                        "replicas": target.workers,
                        "minReplicas": target.workers,
                        "maxReplicas": target.workers,
                        "rayStartParams": {**target.worker_start_params, **node_params},
                        "template": {"spec": {"terminationGracePeriodSeconds": grace, "containers": [worker]}},
                    }
                ],
            },
        },
    }


class _ManifestDumper(yaml.SafeDumper):
    """Block style; a multi-line string (serveConfigV2) as a literal block; the env list shared by head and
    workers written once, as the anchor ``cluster-env``."""

    def generate_anchor(self, node):
        if getattr(self, "_anchored", False):
            raise ValueError("only the env list may appear twice in a manifest (a shared object elsewhere)")
        self._anchored = True
        return "cluster-env"


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_ManifestDumper.add_representer(str, _str)


def header(target: Manifest, image: str | None = None) -> str:
    """The manifest's opening comment: where it comes from, what differs from the single host, and why."""
    lines = [
        f"# GENERATED by `{GENERATOR}` from {target.serve_config.name} and serve_app/engine/cluster_env.py's",
        "# environment table; edit those and run it again (tests/test_kuberay.py fails on a manifest that differs).",
        f"# A RayService for KubeRay 1.7 (ray.io/v1) running the {target.name.upper()} config: docs/kubernetes.md.",
        "#",
        f"# Before `kubectl apply -f`: the image {image or target.image} (deploy/Dockerfile) where the cluster can",
        f"# pull it (or `{GENERATOR} --target {target.name} --image REGISTRY/IMAGE:TAG --out FILE`), and the Secret:",
        f"#   kubectl create secret generic {API_KEYS_SECRET} --from-literal={API_KEYS_SECRET_KEY}=KEY1,KEY2",
        "#",
        f"# serveConfigV2 is {target.serve_config.name} with these changes:",
    ]
    for change, why in K8S_SERVE_CHANGES:
        lines.append(f"#   {change}: {why}")
    lines.append("# The environment (below, on every container) is scripts/env.sh's, except:")
    grouped: dict[EnvRule, list[str]] = {}
    for k, rule in env_rules(target.name).items():
        if rule.action != "keep" and k in ce.CLUSTER_ENV:
            grouped.setdefault(rule, []).append(k)
    for rule, names in grouped.items():
        lines.append(f"#   {', '.join(names)}: {_ACTION[rule.action]}: {rule.why}")
    lines.append("# Not set though KubeRay's high-throughput LLM sample sets them:")
    lines.extend(f"#   {k}: {why}" for k, why in NOT_FROM_THE_SAMPLE.items())
    lines += [
        "# Ports: Ray's ports between nodes pinned (rayStartParams) and named on the containers, so that a",
        "# NetworkPolicy can name each; ranges: the workers' gRPC ports 10002-19999, Serve's replica and router",
        "# ports 30000-31000 (docs/kubernetes.md#ports-and-exposure).",
        "# Probes: what KubeRay 1.7 injects for Ray >= 2.53, written out (node health; a worker is ready once its",
        "# raylet and Serve's HAProxy answer). Workers: one engine replica each, drained within",
        "# terminationGracePeriodSeconds (graceful_shutdown_timeout_s + 30 s).",
    ]
    return "\n".join(_fold(line) for line in lines) + "\n"


def _fold(line: str, width: int = 118) -> str:
    """A comment line folded at ``width``, continuations indented under its text (an indented comment's too)."""
    if len(line) <= width:
        return line
    lead = line[: len(line) - len(line.lstrip())]
    indent = lead + ("#     " if line.lstrip().startswith("#   ") else "# ")
    words, out, cur = line.lstrip().split(" "), [], lead
    for w in words:
        if cur.strip() and len(cur) + 1 + len(w) > width:
            out.append(cur)
            cur = indent + w
        else:
            cur = f"{cur} {w}" if cur.strip() else cur + w
    out.append(cur)
    return "\n".join(out)


def _comment_env(text: str, target: Manifest) -> str:
    """One ``# why`` comment above each variable of the anchored env list (the workers' alias shares it)."""
    whys = {k: why for k, (_, why) in cluster_env_for(target.name).items()}
    whys[API_KEYS_ENV] = "the guard's API keys, from the Secret (several: comma-separated)"
    out, seen, in_anchor = [], set(), False
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("env: &cluster-env"):
            in_anchor = True
        elif in_anchor and stripped.startswith("- name: "):
            var = stripped[len("- name: ") :]
            if var in whys and var not in seen:
                seen.add(var)
                out.append(_fold(" " * (len(line) - len(stripped)) + "# " + whys[var]))
        elif in_anchor and not stripped.startswith(("value", "valueFrom", "secretKeyRef", "name:", "key:")):
            in_anchor = False
        out.append(line)
    return "\n".join(out) + "\n"


def render(target: Manifest, image: str | None = None, name: str | None = None) -> str:
    """``target``'s manifest as the YAML text committed in deploy/ (header, document, env comments)."""
    body = yaml.dump(manifest(target, image, name), Dumper=_ManifestDumper, sort_keys=False, width=120)
    return header(target, image) + _comment_env(body, target)


# ----------------------------------------------------------------------------- the image
def constraints(path: Path = CONSTRAINTS) -> dict[str, str]:
    """constraints.txt's pins: normalised package name -> version."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if not version:
            raise ValueError(f"{path.name}: {raw!r} is not an exact pin (name==version)")
        pins[normalise(name)] = version.strip()
    return pins


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower().strip()


def installed_mismatches(pins: Mapping[str, str]) -> list[str]:
    """Every installed distribution of ``pins`` whose version differs (a local label, ``+cpu``, aside)."""
    wrong = []
    for dist, version in pins.items():
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if have.split("+", 1)[0] != version:
            wrong.append(f"{dist} {have} (constraints.txt: {version})")
    return wrong


def check_image() -> list[str]:
    """What the manifests rely on in the environment this runs in (the image's last build step): the pinned
    versions installed, vLLM present, Ray at the manifests' rayVersion, the project's plugin importable."""
    problems = installed_mismatches(constraints())
    if metadata.version("ray") != RAY_VERSION:
        problems.append(f"ray {metadata.version('ray')}: the manifests' rayVersion is {RAY_VERSION}")
    if not any(_installed(d) for d in ("vllm", "vllm-cpu")):
        problems.append("no vLLM build installed (vllm or vllm-cpu)")
    try:
        import patches  # noqa: F401  (the vLLM plugin every engine process loads)
        import serve_app.app  # noqa: F401
    except Exception as e:  # the image is unusable; say why
        problems.append(f"the project does not import: {e!r}")
    if str(dc.PROJECT_ROOT) != IMAGE_PROJECT:
        problems.append(f"the project is at {dc.PROJECT_ROOT}, not {IMAGE_PROJECT} (the manifests' paths)")
    return problems


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


# ----------------------------------------------------------------------------- command line
def drifted(target: Manifest) -> str | None:
    """Why ``target``'s committed manifest differs from what this module writes; None when equal."""
    if not target.manifest.exists():
        return f"{target.manifest} is missing"
    if target.manifest.read_text() != render(target):
        return f"{target.manifest.relative_to(dc.PROJECT_ROOT)} differs from `{GENERATOR}`'s output"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=sorted(TARGETS), action="append", help="default: every target")
    ap.add_argument("--image", help="the image the pods run (default: the committed manifest's)")
    ap.add_argument("--name", help="the RayService's name (default: fuzzserve-<target>)")
    ap.add_argument(
        "--serve-config", type=Path, help="a Serve config of your own instead of the target's (one --target)"
    )
    ap.add_argument("--out", type=Path, help="write here instead of deploy/ (one --target)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed manifest drifted or fails the checks")
    ap.add_argument("--check-image", action="store_true", help="check this environment is what the manifests need")
    ap.add_argument("--validate", type=Path, nargs="+", metavar="FILE", help="run the offline checks on these files")
    args = ap.parse_args(argv)
    command_logging()  # plain lines, the libraries' from WARNING up (Ray Serve LLM's JSON records otherwise)
    if args.validate:
        problems = [f"{f}: {p}" for f in args.validate for d in documents(f) for p in check_manifest(d)]
        for p in problems:
            sys.stderr.write(f"kuberay: {p}\n")
        return 1 if problems else 0
    if args.check_image:
        problems = check_image()
        for p in problems:
            sys.stderr.write(f"check-image: {p}\n")
        return 1 if problems else 0
    targets = [TARGETS[t] for t in (args.target or sorted(TARGETS))]
    if args.check:
        problems = [d for t in targets if (d := drifted(t))]
        problems += [f"{t.manifest.name}: {p}" for t in targets for p in check_manifest(yaml.safe_load(render(t)))]
        for p in problems:
            sys.stderr.write(f"kuberay: {p}\n")
        return 1 if problems else 0
    if (args.out or args.serve_config) and len(targets) != 1:
        ap.error("--out and --serve-config make one manifest: name its --target")
    if args.serve_config:
        targets = [dataclasses.replace(targets[0], serve_config=args.serve_config.resolve())]
    for t in targets:
        path = args.out or t.manifest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(t, args.image, args.name))
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
