"""A RayService manifest's pods, emulated on this host: each pod a network namespace of its own, started as
KubeRay starts its containers, from the manifest itself.

Why: no Kubernetes cluster can be reached from this project's machines, and
the offline checks (:mod:`serve_app.config.kuberay_schema`) say whether
KubeRay would accept a manifest, not whether what it starts works. This runs
what the manifest makes KubeRay run, as close as one host allows:

* **a pod = a network namespace** (Linux ``ip netns``) with its own address on
  a bridge, its own loopback and ports (every pod listens on 8000, 8080,
  52365 as in a cluster), a private ``/tmp`` (a tmpfs in its own mount
  namespace: the manifest leaves out the single host's ``RAY_TMPDIR``), and,
  for workers, the CPUs the kubelet's static CPU manager would give a
  Guaranteed pod (``taskset``: the cores the engine binding picks from);
* **the container's environment** exactly: the manifest's ``env`` (the
  Secret's key filled in), what KubeRay adds (``RAY_AUTH_MODE=token``,
  ``RAY_AUTH_TOKEN``), what the image sets (its HAProxy wrapper's paths, here
  this checkout's), nothing inherited from this shell;
* **``ray start``** with the group's ``rayStartParams`` as flags (KubeRay's
  ``--port``, ``--dashboard-agent-listen-port`` and the workers' ``--address``
  added as KubeRay adds them), the workers joining the head by its address;
* **the deploy** as KubeRay's operator does it: ``serveConfigV2`` PUT to the
  head's dashboard (``/api/serve/applications/``) with the cluster's token;
* **the probes**, run literally: the manifest's liveness and readiness
  ``httpGet`` and ``exec`` actions inside each pod's namespace.

Then it checks what a user of docs/kubernetes.md would: every pod's Serve
port answers a keyed fuzz request (and refuses an unkeyed one), one engine
replica runs on each worker pod, every worker's metrics endpoint shows the
engine's counters; and, with ``--load-test SCENARIO``, runs the load-test CLI
against the head's Serve port with every worker's metrics endpoint, as the
docs' step 7 does through port-forwards.

Root only (namespaces, a bridge, mounts). Everything it starts is stopped by
process id (the processes of each namespace), the namespaces and the bridge
removed, whatever happened. One run at a time, nothing else on the host
(it starts engines)::

    python -m testkit.kuberay_pods deploy/rayservice.cpu.yaml --out out/kuberay_pods [--load-test smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from ray.serve.schema import ServeInstanceDetails

from serve_app.config import deploy_config as dc
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX
from serve_app.engine.cluster_env import AUTH_MODE, AUTH_TOKEN, BIN, haproxy_binary_env

log = logging.getLogger("testkit.kuberay_pods")

BRIDGE = "fzsbr0"
SUBNET = "10.77.0"
GATEWAY = f"{SUBNET}.1"
GCS_PORT = 6379  # KubeRay's default --port for the head
DASHBOARD_PORT = 8265
AGENT_PORT = 52365  # KubeRay's default --dashboard-agent-listen-port
API_KEY = "pods-" + secrets.token_hex(8)


@dataclass
class Pod:
    """One pod of the manifest: its group, its container, its address and namespace."""

    name: str
    group: dict[str, Any]
    ip: str
    cpus: str | None  # a Guaranteed pod's own cores (taskset list); None: the head, shares the host's
    head: bool = False
    log_file: Path | None = None
    probes: dict[str, Any] = field(default_factory=dict)

    @property
    def netns(self) -> str:
        return f"fzs-{self.name}"

    @property
    def container(self) -> dict[str, Any]:
        return self.group["template"]["spec"]["containers"][0]


def pods_of(doc: dict[str, Any]) -> list[Pod]:
    """The head and every worker replica, each worker on cores of its own (as many as its CPU limit)."""
    cluster = doc["spec"]["rayClusterConfig"]
    pods = [Pod("head", cluster["headGroupSpec"], f"{SUBNET}.10", None, head=True)]
    next_core, n = 0, 0
    host_cores = len(os.sched_getaffinity(0))
    for group in cluster["workerGroupSpecs"]:
        for _ in range(group["replicas"]):
            n += 1
            limit = group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
            # ray's logical CPUs are what fit counts; the engine binds to the first of the pod's cores. On a host
            # with fewer cores than the pods ask for, each worker gets one core of its own (the engine's).
            want = min(int(float(limit)), max(1, host_cores // sum(g["replicas"] for g in cluster["workerGroupSpecs"])))
            cores = [(next_core + i) % host_cores for i in range(want)]
            next_core += want
            pods.append(Pod(f"w{n}", group, f"{SUBNET}.{10 + n}", ",".join(map(str, cores))))
    return pods


def pod_env(container: dict[str, Any], token: str, secrets_: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment as Kubernetes and KubeRay give it, plus what the image sets."""
    env = {
        "PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        # KubeRay, from authOptions.mode: token
        AUTH_MODE: "token",
        AUTH_TOKEN: token,
        # the image (deploy/Dockerfile's ENV), at this checkout's paths
        **haproxy_binary_env(),
    }
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = secrets_[(ref["name"], ref["key"])]
    return env


def start_args(pod: Pod, head_ip: str) -> list[str]:
    """``ray start`` for the pod, flags from its group's ``rayStartParams`` (KubeRay's own additions first)."""
    # KubeRay's defaults where the group does not set them, then the group's own
    params = {"dashboard-agent-listen-port": str(AGENT_PORT), **(pod.group.get("rayStartParams") or {})}
    args = ["--head", f"--port={GCS_PORT}"] if pod.head else [f"--address={head_ip}:{GCS_PORT}"]
    args += [f"--{k}={v}" for k, v in params.items()]
    return [str(BIN / "ray"), "start", *args]


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)


class PodNetwork:
    """The bridge and one namespace per pod; on exit every process of each namespace ends (by id), then the
    namespaces and the bridge go."""

    def __init__(self, pods: list[Pod]):
        self.pods = pods

    def __enter__(self) -> PodNetwork:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i, pod in enumerate(self.pods):
            veth = f"fzsv{i}"
            sh("ip", "netns", "add", pod.netns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
            sh("ip", "link", "set", veth, "master", BRIDGE, "up")
            for cmd in (
                ("ip", "addr", "add", f"{pod.ip}/24", "dev", "eth0"),
                ("ip", "link", "set", "eth0", "up"),
                ("ip", "link", "set", "lo", "up"),
                ("ip", "route", "add", "default", "via", GATEWAY),
            ):
                sh("ip", "netns", "exec", pod.netns, *cmd)
        return self

    def pids(self, pod: Pod) -> list[int]:
        out = sh("ip", "netns", "pids", pod.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def __exit__(self, *exc: object) -> None:
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            for pod in self.pods:
                for pid in self.pids(pod):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(self.pids(p) for p in self.pods):
                time.sleep(0.5)
        for pod in self.pods:
            sh("ip", "netns", "del", pod.netns, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)

    def run_in(self, pod: Pod, argv: list[str], env: dict[str, str], log_file: Path, timeout: float = 300) -> int:
        """``argv`` in the pod: its namespace, a private tmpfs /tmp, its cores, exactly ``env``."""
        inner = " ".join(shlex.quote(a) for a in argv)
        script = f"mount -t tmpfs -o mode=1777 tmpfs /tmp && exec {inner}"
        cmd = ["ip", "netns", "exec", pod.netns, "unshare", "-m", "--propagation", "private"]
        if pod.cpus:
            cmd += ["taskset", "-c", pod.cpus]
        cmd += ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", script]
        with log_file.open("a") as out:
            return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode

    def probe(self, pod: Pod, probe: dict[str, Any]) -> bool:
        """A Kubernetes probe action of the manifest, run in the pod (what the kubelet does)."""
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{pod.ip}:{get['port']}{get['path']}"
            r = sh("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5", url, check=False)
            return r.stdout.strip().startswith("2")
        command = probe["exec"]["command"]
        r = subprocess.run(
            ["ip", "netns", "exec", pod.netns, *command], capture_output=True, text=True, timeout=30, check=False
        )
        return r.returncode == 0


def wait(what: str, ready: Callable[[], bool], timeout: float, interval: float = 3.0) -> float:
    """Seconds until ``ready()``; a TimeoutError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while not ready():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
    return time.monotonic() - start


def emulate(manifest: Path, out: Path, load_test: str | None = None) -> dict[str, Any]:
    """Run the manifest's pods, deploy, probe, serve, optionally load-test; the findings as a dict."""
    [doc] = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    pods = pods_of(doc)
    head = pods[0]
    token = secrets.token_hex(32)
    secret_values = {("fuzzserve-api-keys", "keys"): API_KEY}
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {"manifest": str(manifest), "pods": {p.name: {"ip": p.ip, "cpus": p.cpus} for p in pods}}
    auth = {"authorization": f"Bearer {token}"}
    dashboard = f"http://{head.ip}:{DASHBOARD_PORT}"
    with PodNetwork(pods) as net:
        for pod in pods:
            pod.log_file = out / f"{pod.name}.log"
            env = pod_env(pod.container, token, secret_values)
            rc = net.run_in(pod, start_args(pod, head.ip), env, pod.log_file)
            if rc != 0:
                raise RuntimeError(f"ray start in pod {pod.name} exited {rc}: {pod.log_file.read_text()[-2000:]}")
            if pod.head:
                found["head_dashboard_s"] = wait(
                    "the head's dashboard",
                    lambda: _ok(httpx.get, f"{dashboard}/api/serve/applications/", headers=auth),
                    120,
                )
        log.info("pods started: %s", ", ".join(f"{p.name} {p.ip}" for p in pods))
        found["nodes_alive"] = wait("every pod's node", lambda: _alive_nodes(dashboard, auth) == len(pods), 120)
        # probes before the deploy: node health passes everywhere; a worker is not ready without Serve
        found["probes_before_deploy"] = _probes(net, pods)
        serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
        log.info("deploying serveConfigV2 through the head's dashboard, as KubeRay's operator does")
        r = httpx.put(f"{dashboard}/api/serve/applications/", json=serve_config, headers=auth, timeout=60)
        r.raise_for_status()
        found["deploy_s"] = wait("the application RUNNING", lambda: _running(dashboard, auth), 900, interval=5)
        log.info("application RUNNING after %.0f s; probing, requesting, reading metrics", found["deploy_s"])
        found["probes_after_deploy"] = _probes(net, pods)
        found["replicas_by_pod"] = _replicas_by_pod(dashboard, auth, pods)
        found["requests"] = _requests(pods, dc.parse(serve_config))
        found["metrics"] = _metrics(pods)
        if load_test:
            log.info("load test %r against the pods", load_test)
            found["load_test"] = _load_test(load_test, pods, out)
        log.info("stopping every process of the pods (by id), removing the namespaces")
    (out / "summary.json").write_text(json.dumps(found, indent=2) + "\n")
    return found


def _ok(get: Callable[..., httpx.Response], url: str, **kw: Any) -> bool:
    try:
        return get(url, timeout=5, **kw).status_code == 200
    except httpx.HTTPError:
        return False


def _alive_nodes(dashboard: str, auth: dict[str, str]) -> int:
    try:
        r = httpx.get(f"{dashboard}/nodes?view=summary", headers=auth, timeout=10)
        return sum(1 for n in r.json()["data"]["summary"] if n["raylet"]["state"] == "ALIVE")
    except (httpx.HTTPError, KeyError, ValueError):
        return 0


def _details(dashboard: str, auth: dict[str, str]) -> ServeInstanceDetails:
    """The dashboard's Serve state, read by Ray's own schema (what ``serve status`` reads)."""
    r = httpx.get(f"{dashboard}/api/serve/applications/", headers=auth, timeout=10)
    r.raise_for_status()
    return ServeInstanceDetails.model_validate(r.json())


def _running(dashboard: str, auth: dict[str, str]) -> bool:
    apps = _details(dashboard, auth).applications
    statuses = {name: str(a.status.value) for name, a in apps.items()}
    if "DEPLOY_FAILED" in statuses.values():
        raise RuntimeError(f"the deploy failed: {[a.message for a in apps.values()]}")
    return bool(statuses) and set(statuses.values()) == {"RUNNING"}


def _probes(net: PodNetwork, pods: list[Pod]) -> dict[str, dict[str, bool]]:
    return {
        p.name: {kind: net.probe(p, p.container[kind]) for kind in ("livenessProbe", "readinessProbe")} for p in pods
    }


def _replicas_by_pod(dashboard: str, auth: dict[str, str], pods: list[Pod]) -> dict[str, int]:
    """Engine replicas (Serve's running replicas of the engine deployment) per pod, by their node's address."""
    by_ip = {p.ip: p.name for p in pods}
    counts = {p.name: 0 for p in pods}
    for app in _details(dashboard, auth).applications.values():
        for name, dep in app.deployments.items():
            if not name.startswith(ENGINE_DEPLOYMENT_PREFIX):
                continue
            for rep in dep.replicas:
                if str(rep.state.value) == "RUNNING":
                    where = by_ip.get(rep.node_ip or "", "elsewhere")
                    counts[where] = counts.get(where, 0) + 1
    return counts


def _requests(pods: list[Pod], cfg: dc.ServeConfig) -> dict[str, Any]:
    """A keyed fuzz completion through every pod's Serve port, and an unkeyed one (refused)."""
    model = dc.first_llm(cfg).model_loading_config.model_id
    body = {"model": model, "prompt": "12+7=", "max_tokens": 4, "vllm_xargs": {"fuzz_strength": 0.5}}
    got: dict[str, Any] = {}
    for p in pods:
        url = f"http://{p.ip}:{dc.http_port(cfg)}/v1/completions"
        keyed = httpx.post(url, json=body, headers={"authorization": f"Bearer {API_KEY}"}, timeout=120)
        unkeyed = httpx.post(url, json=body, timeout=60)
        got[p.name] = {
            "keyed": keyed.status_code,
            "text": keyed.json()["choices"][0]["text"] if keyed.status_code == 200 else keyed.text[:300],
            "unkeyed": unkeyed.status_code,
        }
    return got


def _metrics(pods: list[Pod], timeout: float = 90) -> dict[str, int]:
    """vLLM's series (``ray_vllm_*``) on each pod's metrics export port (8080), once every worker shows its
    engine's (Ray's metrics agent exports on its own period). Any series: the affinity router may have sent every
    request above to one replica, and the other's token counters appear with its first request."""

    def series() -> dict[str, int]:
        counts = {}
        for p in pods:
            try:
                text = httpx.get(f"http://{p.ip}:8080/metrics", timeout=20).text
            except httpx.HTTPError:
                text = ""
            counts[p.name] = sum(1 for ln in text.splitlines() if ln.startswith("ray_vllm_"))
        return counts

    with contextlib.suppress(TimeoutError):
        wait("every worker's engine counters", lambda: all(series()[p.name] for p in pods if not p.head), timeout)
    return series()


def _load_test(scenario: str, pods: list[Pod], out: Path) -> dict[str, Any]:
    """The load-test CLI against the head's Serve port with every worker's metrics endpoint (docs/kubernetes.md)."""
    cmd = [
        sys.executable, "-m", "load_tests", "--scenario", scenario, "--url", f"http://{pods[0].ip}:8000",
        "--allow-remote", "--api-key", API_KEY, "--no-sweep", "--no-progress", "--out", str(out / "load_test"),
    ]  # fmt: skip
    for p in pods[1:]:
        cmd += ["--metrics-url", f"http://{p.ip}:8080/metrics"]
    with (out / "load_test.log").open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800).returncode
    summary = out / "load_test" / "summary.json"
    return {"exit_code": rc, "command": " ".join(cmd), "summary": str(summary) if summary.exists() else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest", type=Path)
    ap.add_argument("--out", type=Path, default=Path("out/kuberay_pods"))
    ap.add_argument("--load-test", metavar="SCENARIO", help="then run the load-test CLI's scenario against the pods")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    if os.geteuid() != 0:
        ap.error("needs root (network namespaces, a bridge, mounts)")
    found = emulate(args.manifest, args.out, args.load_test)
    sys.stdout.write(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
