"""Port picking for the servers the project starts (load_tests.operate.ports): pure socket-level checks."""

from __future__ import annotations

import random
import socket

from load_tests.operate import ports


def test_ports_avoid_the_ephemeral_range_and_are_never_handed_out_twice():
    lo, hi = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
    assert not [p for p in picked if lo <= p <= hi], "a picked port lies where the kernel assigns outgoing ports"
    with socket.socket() as s:  # and each one can actually be listened on
        s.bind(("127.0.0.1", picked[-1]))


def test_a_port_someone_listens_on_is_skipped():
    seed = 1234
    first = random.Random(seed).randrange(*ports.candidate_range())
    with socket.socket() as s:
        s.bind(("127.0.0.1", first))
        s.listen()
        got = ports.free_port(random.Random(seed))  # the same draw sequence: its first candidate is taken
    assert got != first
