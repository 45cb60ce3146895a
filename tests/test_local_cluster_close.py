"""LocalCluster.close(graceful=False): every process the nodes started is killed by pid, including ones forked
while the kill runs (as a raylet or Serve's proxy may start one when others die), and the nodes stop. No Ray here:
each node is a stand-in process whose child keeps forking, as a replica or proxy actor under a raylet would."""

from __future__ import annotations

import os
import sys
import time

import psutil

from load_tests.operate.local_cluster import LocalCluster, RayNode

# The node's process starts one "manager" child, which forks a short-lived grandchild every 10 ms (at most 400).
NODE = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
time.sleep(600)
"""
MANAGER = """
import os, sys, time
for _ in range(400):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.01)
time.sleep(60)
"""


def test_a_fast_close_kills_every_process_of_every_node_even_those_forked_meanwhile(tmp_path):
    marker = f"fuzzserve-close-test-{os.getpid()}"
    nodes = [
        RayNode(name, [sys.executable, "-c", NODE, MANAGER, marker], 0, tmp_path / f"{name}.log", dict(os.environ))
        for name in ("head", "worker1")
    ]
    for node in nodes:
        node.start()
    cluster = LocalCluster(nodes=nodes, log_dir=tmp_path)
    try:
        time.sleep(1.5)
        assert all(len(n.descendants()) > 20 for n in nodes), "the managers fork (the test sees what it looks for)"
        started = time.monotonic()
        cluster.close(graceful=False)
        took = time.monotonic() - started
    finally:
        for node in nodes:  # should the close fail: what this test started, by pid
            for p in node.descendants():
                p.kill()
            node.stop(timeout=5)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]
    assert left == [], "processes of the nodes outlived the close"
    assert not any(n.alive() for n in nodes)
    assert took < 30, f"the close took {took:.0f} s"
