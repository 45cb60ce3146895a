#!/bin/sh
# Serve's HAProxy, started through this wrapper (RAY_SERVE_HAPROXY_BINARY_PATH, set for `ray start` by
# serve_app/engine/cluster_env.py): two settings Ray 2.60's HAProxy template has no variable for, written into the
# config Ray just wrote, then the real binary exec'd with Ray's own arguments (same argv, same pid: Ray checks both).
#
#   timeout http-request 30s   a request must be complete, and routed, within 30 s: without it a client that
#                              trickles one header byte at a time keeps its connection (and one of maxconn's
#                              slots) for as long as it likes ("timeout client" is reset by every byte). Not
#                              shorter: the timer also runs while HAProxy asks the ingress request router for a
#                              replica (Ray's Lua: wait-for-body 5 s, then 5 s per router of the pool), and in a
#                              256-stream redeploy on 2 cores routing calls queued for up to 14 s behind a busy
#                              router; with 10 s, 47 of 19959 requests got HAProxy's 408 (issue 34,
#                              docs/load_tests.md#a-redeploy-without-the-clients-retry-issue-34). 30 s is also "timeout client": a slow
#                              sender holds a slot no longer than a silent one
#   stats / prometheus ports   bound to 127.0.0.1 instead of every interface (Ray binds them to *; they show
#                              replica addresses, traffic and cache-hit counts)
#   no access log              the global "log <RAY_SERVE_HAPROXY_LOG_TARGET> local0 info" line removed: Ray's
#                              template sends one httplog line per request (and per health check) by UDP syslog
#                              to 127.0.0.1:514, where nothing in Ray or this project listens; with no logger
#                              HAProxy does not format the line at all. FUZZSERVE_HAPROXY_ACCESS_LOG=1 keeps it
#                              (an operator with a syslog daemon there; the A/B arm in docs/benchmarks.md)
#
# Each edit is made where the template's line is found and nowhere else; tests/test_serve_app.py reads the
# deployed config and fails if an edit is missing (a Ray upgrade that changed the template), so production never
# runs without them unnoticed. docs/security.md says why each one is needed.
set -u
real=${FUZZSERVE_HAPROXY_REAL:?FUZZSERVE_HAPROXY_REAL names the real haproxy binary}
cfg=""
prev=""
for arg in "$@"; do
    [ "$prev" = "-f" ] && cfg=$arg
    prev=$arg
done
if [ -n "$cfg" ] && [ -w "$cfg" ] && ! grep -q '^    # fuzzserve edge$' "$cfg"; then
    stats=${RAY_SERVE_HAPROXY_STATS_PORT:-8404}
    metrics=${RAY_SERVE_HAPROXY_METRICS_PORT:-9101}
    sed -i \
        -e 's/^defaults$/defaults\n    # fuzzserve edge\n    timeout http-request '"${FUZZSERVE_HAPROXY_HTTP_REQUEST_TIMEOUT_S:-30}"'s/' \
        -e 's/^\( *bind \)\*\{0,1\}:\('"$stats"'\|'"$metrics"'\) *$/\1127.0.0.1:\2/' \
        "$cfg"
    if [ "${FUZZSERVE_HAPROXY_ACCESS_LOG:-0}" != "1" ]; then
        sed -i -e '/^    log [^ ]* local0 info$/d' "$cfg"
    fi
fi
exec "$real" "$@"
