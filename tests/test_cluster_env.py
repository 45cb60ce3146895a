"""The environment of `ray start` (serve_app/engine/cluster_env.py): one table, exported by scripts/env.sh, set by
LocalCluster, a value already set winning everywhere."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from serve_app.engine.cluster_env import HAPROXY

REPO = Path(__file__).resolve().parents[1]


def _shell(exports: str, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f"{exports}\nenv -0"], env=env, capture_output=True, check=True).stdout
    return dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)


def test_exports_set_every_variable_and_keep_a_value_already_set():
    from serve_app.engine.cluster_env import CLUSTER_ENV, exports

    base = {"PATH": os.environ["PATH"]}
    got = _shell(exports(), base)
    assert {k: got[k] for k in CLUSTER_ENV} == CLUSTER_ENV
    got = _shell(exports(), {**base, HAPROXY: "0"})
    assert got[HAPROXY] == "0"


def test_env_sh_evaluates_the_table():
    """scripts/env.sh (what README has users source before `ray start`) exports exactly the table's values."""
    from serve_app.engine.cluster_env import CLUSTER_ENV

    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
    out = subprocess.run(
        ["bash", "-c", f"source {REPO}/scripts/env.sh >/dev/null && env -0"],
        env=env,
        capture_output=True,
        check=True,
        cwd=REPO,
    ).stdout
    got = dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    assert {k: got.get(k) for k in CLUSTER_ENV} == CLUSTER_ENV


def test_local_cluster_uses_the_table_and_lets_its_env_win():
    from load_tests.operate.local_cluster import LocalCluster
    from serve_app.engine.cluster_env import CLUSTER_ENV

    env = LocalCluster(env={HAPROXY: "0"})._env()
    assert env[HAPROXY] == "0"
    assert all(env[k] == v for k, v in CLUSTER_ENV.items() if k != HAPROXY)
    # usage stats off on every node (Ray's own flag reaches the head only), unless the caller says otherwise
    assert LocalCluster(workers=1)._env()["RAY_USAGE_STATS_ENABLED"] == "0"
    assert LocalCluster(env={"RAY_USAGE_STATS_ENABLED": "1"})._env()["RAY_USAGE_STATS_ENABLED"] == "1"


def test_the_direct_path_check_reads_the_same_names():
    from serve_app.app import require_haproxy
    from serve_app.engine.cluster_env import CLUSTER_ENV, HAPROXY_ENV

    assert set(HAPROXY_ENV) <= set(CLUSTER_ENV)
    require_haproxy(True, dict(CLUSTER_ENV))  # what the table sets passes the builder's check


def test_every_serve_variable_of_the_table_is_one_ray_serve_reads():
    """A misspelt name would be ignored without a word: each RAY_SERVE_* name is read in Serve's own constants."""
    import ray.serve._private.constants as constants

    from serve_app.engine.cluster_env import CLUSTER_ENV

    source = Path(constants.__file__).read_text()
    names = [k for k in CLUSTER_ENV if k.startswith("RAY_SERVE_")]
    assert "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE" in names
    assert [k for k in names if f'"{k}"' not in source] == []
    assert '"RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODES"' not in source, "the check can fail"


def test_the_auth_token_is_made_and_kept_readable_by_its_user_only(tmp_path):
    """Ray writes its token 0644 in a 0755 directory; the token is the key to running code on the cluster."""
    from serve_app.engine.cluster_env import AUTH_MODE, AUTH_TOKEN_PATH, ensure_auth_token

    token = tmp_path / "ray" / "auth_token"
    token.parent.mkdir(mode=0o755)
    token.write_text("t" * 64)
    token.chmod(0o644)  # as Ray leaves it
    assert ensure_auth_token({AUTH_MODE: "token", AUTH_TOKEN_PATH: str(token)}) == token
    assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
    assert token.read_text() == "t" * 64, "the token itself is kept"
    assert ensure_auth_token({AUTH_MODE: "disabled"}) is None


def test_the_dashboard_queries_present_the_token_as_rays_clients_do(tmp_path):
    """LocalCluster's state queries go to the dashboard's HTTP API in-process: under token auth they present the
    token (the variable first, else the file Ray's CLI reads) as ``authorization: Bearer``; without it, nothing."""
    from serve_app.engine.cluster_env import AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH, auth_headers

    token = tmp_path / "auth_token"
    token.write_text("t" * 64 + "\n")
    assert auth_headers({AUTH_MODE: "token", AUTH_TOKEN_PATH: str(token)}) == {"authorization": "Bearer " + "t" * 64}
    assert auth_headers({AUTH_MODE: "token", AUTH_TOKEN: "x", AUTH_TOKEN_PATH: str(token)}) == {
        "authorization": "Bearer x"
    }
    assert auth_headers({AUTH_MODE: "disabled", AUTH_TOKEN_PATH: str(token)}) == {}
    assert auth_headers({}) == {}


def test_serves_haproxy_files_go_to_a_directory_only_this_user_can_enter(tmp_path):
    from serve_app.engine.cluster_env import CLUSTER_ENV, ensure_haproxy_dir, haproxy_dir, haproxy_env

    d = ensure_haproxy_dir(tmp_path / "fzs")
    assert d.stat().st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    assert ensure_haproxy_dir(tmp_path / "open").stat().st_mode & 0o777 == 0o700  # readable by others: closed
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared").chmod(0o777)
    import pytest

    with pytest.raises(PermissionError, match="writable by other users"):
        ensure_haproxy_dir(tmp_path / "shared")  # others may have planted files there: refused, not adopted
    (tmp_path / "link").symlink_to(tmp_path / "fzs")
    with pytest.raises(PermissionError, match="not this user's own directory"):
        ensure_haproxy_dir(tmp_path / "link")
    # every path Ray takes for HAProxy lies in that directory, and the admin socket's full path (Ray adds a
    # 56-character node id and a temporary suffix) fits a Unix socket path
    paths = haproxy_env(haproxy_dir())
    assert all(CLUSTER_ENV[k] == v for k, v in paths.items())
    assert all(Path(v) == haproxy_dir() or Path(v).parent == haproxy_dir() for v in paths.values())
    assert len(paths["RAY_SERVE_HAPROXY_SOCKET_PATH"]) + 1 + 56 + 16 < 108


def test_rays_temp_root_is_under_the_private_directory_and_its_listeners_on_loopback(tmp_path):
    """RAY_TMPDIR puts Ray's sessions under the 0700 directory (Ray makes /tmp/ray and everything it creates 0777);
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray take loopback as the node's address, as Ray itself reads it."""
    from ray._common.utils import get_default_ray_temp_dir

    from serve_app.engine.cluster_env import CLUSTER_ENV, RAY_TMPDIR, SINGLE_HOST, haproxy_dir, prepare_node, ray_root

    assert CLUSTER_ENV[RAY_TMPDIR] == str(haproxy_dir()) and CLUSTER_ENV[SINGLE_HOST] == "0"
    assert ray_root({RAY_TMPDIR: "/x/y"}) == Path("/x/y/ray")
    assert ray_root({"TMPDIR": "/t"}) == Path("/t/ray") and ray_root({}) == Path("/tmp/ray")
    import os
    import subprocess
    import sys

    code = (
        "from ray._common.utils import get_default_ray_temp_dir as d; import ray._private.ray_constants as c; "
        "print(d()); print(c.ENABLE_RAY_CLUSTER)"
    )
    for env in ({**os.environ, RAY_TMPDIR: str(tmp_path / "p"), SINGLE_HOST: "1"}, {**os.environ, SINGLE_HOST: "0"}):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        temp, cluster = out.stdout.split()
        assert Path(temp) == ray_root(env), "ray_root is where Ray itself puts its files"
        assert cluster == ("False" if env.get(SINGLE_HOST) == "0" else "True"), "Ray reads the single-host switch"
    assert get_default_ray_temp_dir()  # importable here, as in the subprocess
    from serve_app.engine.cluster_env import AUTH_MODE

    prepare_node({RAY_TMPDIR: str(tmp_path / "private"), AUTH_MODE: "disabled"})
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700


def _is_loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket bound to loopback
    return (mapped or address).is_loopback


def test_the_loopback_check_sees_what_it_looks_for():
    assert _is_loopback("127.0.0.1") and _is_loopback("::ffff:127.0.0.1") and _is_loopback("::1")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("::") and not _is_loopback("192.0.2.2")


@pytest.mark.engine
@pytest.mark.serve
def test_every_listener_of_a_single_host_cluster_is_on_loopback(tmp_path):
    """A head node as README starts it (the project's environment, --node-ip-address 127.0.0.1, a metrics export
    port): every socket any of its processes listens on (GCS, raylet, object manager, dashboard and its agents, the
    metrics export port, the client server, the runtime-env agent, Ray's workers) is on loopback. Before:
    GCS, raylet and workers on every interface, the metrics port on 0.0.0.0, the client server and agents on the
    host's address (Ray turned 127.0.0.1 into it). Serve's own listeners (HAProxy, replicas, routers, the fallback
    proxy) are checked on the deployed cluster (tests/test_serve_app.py)."""
    import psutil

    from load_tests.operate.local_cluster import LocalCluster

    with LocalCluster(num_cpus=1, log_dir=tmp_path) as cluster:
        head = cluster.nodes[0]
        listening = {}
        for p in [psutil.Process(head.process().pid), *head.descendants()]:
            try:
                listening.update(
                    {
                        (c.laddr.ip, c.laddr.port): p.name()
                        for c in p.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN
                    }
                )
            except psutil.Error:
                continue
        names = set(listening.values())
    assert {"gcs_server", "raylet"} <= names and len(listening) >= 9, listening  # it sees Ray's listeners
    assert {k: v for k, v in listening.items() if not _is_loopback(k[0])} == {}


def test_a_cluster_of_several_nodes_runs_without_the_single_host_switch():
    """Ray refuses worker nodes under its single-host switch, and a loopback-only head is out of their reach: a
    LocalCluster with workers (or meant to get them) runs every node without it; a single one keeps the table's."""
    from load_tests.operate.local_cluster import ClusterError, LocalCluster
    from serve_app.engine.cluster_env import SINGLE_HOST

    assert LocalCluster()._env()[SINGLE_HOST] == "0"
    assert LocalCluster(workers=1)._env()[SINGLE_HOST] == "1"
    assert LocalCluster(multi_node=True)._env()[SINGLE_HOST] == "1"
    with pytest.raises(ClusterError, match="single host"):
        LocalCluster().add_worker()


HAPROXY_CFG = """global
    log 127.0.0.1:514 local0 info
    stats socket /tmp/x/admin.sock mode 666 level admin expose-fd listeners
defaults
    mode http
    log global
    option httplog
frontend stats
    bind *:8404
"""


@pytest.mark.parametrize("keep", [False, True])
def test_the_haproxy_wrapper_drops_the_unread_access_log_unless_asked_to_keep_it(tmp_path, keep):
    """serve_app/ingress/haproxy_edge.sh on a config with the lines Ray 2.60's template writes (the engine test
    reads the real one): the access log line to the syslog port nobody reads goes, unless
    FUZZSERVE_HAPROXY_ACCESS_LOG=1; its other edits are made either way."""
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG)
    script = Path(__file__).resolve().parents[1] / "serve_app" / "ingress" / "haproxy_edge.sh"
    env = {**os.environ, "FUZZSERVE_HAPROXY_REAL": "true", "FUZZSERVE_HAPROXY_ACCESS_LOG": "1" if keep else "0"}
    subprocess.run(["sh", str(script), "-f", str(cfg)], env=env, check=True, timeout=30)
    text = cfg.read_text()
    assert ("    log 127.0.0.1:514 local0 info\n" in text) is keep
    assert "    timeout http-request 30s\n" in text and "    bind 127.0.0.1:8404\n" in text
    assert "    log global\n" in text and "stats socket" in text


@pytest.mark.parametrize("config", ["serve_config.yaml", "serve_config.cuda.yaml"])
def test_an_old_haproxy_process_outlives_every_request_a_shipped_config_admits(config):
    """After a reload the old HAProxy process keeps its connections until ``hard-stop-after``: a request it still
    carries then is cut (benchmarks/investigations/haproxy_hard_stop.py, tests/test_haproxy_hard_stop.py). The
    latest it can start is a kept-alive connection's next request (``timeout http-keep-alive`` after the reload),
    routed within ``timeout http-request``; it ends by ``request_timeout_s``."""
    import yaml
    from ray.serve.config import HTTPOptions

    from serve_app.engine.cluster_env import CLUSTER_ENV, HARD_STOP_AFTER, HTTP_REQUEST_TIMEOUT_S

    http = yaml.safe_load((REPO / config).read_text())["http_options"]
    longest = http.get("keep_alive_timeout_s", HTTPOptions().keep_alive_timeout_s) + HTTP_REQUEST_TIMEOUT_S
    longest += http["request_timeout_s"]
    assert float(CLUSTER_ENV[HARD_STOP_AFTER]) >= longest, (config, longest)
