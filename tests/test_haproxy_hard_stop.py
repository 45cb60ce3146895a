"""A stream in flight when HAProxy reloads is cut at the old process's hard-stop-after, and kept by a longer one:
Ray's bundled HAProxy alone (benchmarks/investigations/haproxy_hard_stop.py), times scaled down to seconds."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.investigations.haproxy_hard_stop import one_stream, real_haproxy


@pytest.mark.parametrize(("hard_stop_s", "cut"), [(1.5, True), (8.0, False)])
def test_a_stream_across_a_reload_lives_until_the_old_process_hard_stops(hard_stop_s, cut):
    """A 4 s stream, reloaded 0.5 s in: with hard-stop-after 1.5 s it is cut about 2 s in, mid-body (the control:
    what Ray's 120 s does to a longer stream); with 8 s it arrives whole."""
    o = asyncio.run(one_stream(real_haproxy(), hard_stop_s, stream_s=4, reload_at_s=0.5, interval=0.25))
    if cut:
        assert not o.complete and 0 < o.chunks < o.expected and "incomplete chunked read" in o.error, o
        assert o.seconds < 3.5, o
    else:
        assert o.complete and o.chunks == o.expected and not o.error, o
