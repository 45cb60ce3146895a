"""Fuzz-aware affinity routing, the pure parts: keys, rendezvous hashing, the load fallback.

The routing property on real replicas (same salt + prefix lands on the same
replica; other settings spread) is checked on the deployed app in
tests/test_serve_app.py.
"""

from __future__ import annotations

import asyncio
import types
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.routing.fuzz_router import (
    FuzzAffinityRouter,
    affinity_key,
    choose,
    rendezvous,
    request_text,
    routing_key,
)


def test_fuzz_affinity_key():
    assert affinity_key("abc", None) == "abc"
    assert affinity_key("abc", {"fuzz_strength": 0}) == "abc", "s = 0 shares KV with unfuzzed requests"
    a = affinity_key("abc", {"fuzz_strength": 0.5})
    assert a.endswith("abc") and a != "abc"
    assert affinity_key("abc", {"fuzz_strength": 1.0}) == affinity_key("abc", {"fuzz_strength": 7.0}), (
        "scale s >= 1 all zero the embeddings: one salt"
    )
    assert affinity_key("abc", {"fuzz_strength": 1, "fuzz_mode": "gaussian", "fuzz_seed": 1}) != affinity_key(
        "abc", {"fuzz_strength": 1, "fuzz_mode": "gaussian", "fuzz_seed": 2}
    )
    assert affinity_key("abc", {"fuzz_strength": -1}) == "abc", "invalid settings never reach routing; no crash"


def pending(**body):
    """What LLMRouter hands the policy on the direct path: the body's fields as attributes."""
    return types.SimpleNamespace(args=[types.SimpleNamespace(**body)])


def test_request_text_of_completions_and_chats():
    assert request_text(types.SimpleNamespace(prompt="count 1 2")) == "count 1 2"
    assert request_text(types.SimpleNamespace(prompt=["a ", "b"])) == "a b"
    assert (
        request_text(
            types.SimpleNamespace(
                messages=[
                    {"role": "system", "content": "S"},
                    {"role": "user", "content": [{"type": "text", "text": "U"}]},
                ]
            )
        )
        == "SU"
    )
    assert request_text(types.SimpleNamespace(model="x")) is None


def test_routing_key_cuts_the_prompt_and_keeps_the_salt():
    long = "x " * 400
    a = routing_key(pending(prompt=long + "tail one"), prefix_chars=64)
    assert a == routing_key(pending(prompt=long + "tail two"), prefix_chars=64), "same prefix, same key"
    assert a != routing_key(pending(prompt="y" + long), prefix_chars=64)
    fuzzed = routing_key(pending(prompt=long, vllm_xargs={"fuzz_strength": 0.5}), prefix_chars=64)
    assert fuzzed != a and fuzzed is not None and fuzzed.endswith(long[:64]), (
        "another fuzz setting cannot share the KV: another key"
    )
    assert routing_key(pending(model="fixture"), 64) is None
    assert routing_key(None, 64) is None


def test_rendezvous_is_stable_and_moves_only_a_removed_replicas_keys():
    replicas = [f"r{i}" for i in range(4)]
    keys = [f"prefix {i}" for i in range(400)]
    before = {k: rendezvous(k, replicas) for k in keys}
    assert before == {k: rendezvous(k, list(reversed(replicas))) for k in keys}, "order of replicas is irrelevant"
    spread = Counter(before.values())
    assert set(spread) == set(replicas) and min(spread.values()) > 60, spread  # ~100 each
    after = {k: rendezvous(k, replicas[:3]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "r3" for k in moved), "only the removed replica's keys move"


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(0, 50)), min_size=1),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 20),
)
@settings(max_examples=200, deadline=None)
def test_load_fallback(lens, preferred, threshold):
    lens = {preferred: lens.get(preferred), **lens}
    got = choose(preferred, lens, threshold)
    known = {k: v for k, v in lens.items() if v is not None}
    if not known:
        assert got == preferred
    elif lens[preferred] is not None and lens[preferred] - min(known.values()) <= threshold:
        assert got == preferred, "affinity holds while the preferred replica is within the threshold"
    else:
        assert known[got] == min(known.values()), "otherwise the least-loaded replica takes it"


class _Replica:
    def __init__(self, rid: str):
        self.replica_id = types.SimpleNamespace(to_full_id_str=lambda: rid)


REPLICAS = [_Replica("A"), _Replica("B")]


@pytest.fixture
def queue_lens(monkeypatch) -> dict[str, int | None]:
    """The replicas' in-flight counts the router will see (the probe itself is Ray's RPC, replaced here only)."""
    current: dict[str, int | None] = {}

    async def probe(router, replicas):
        return [(r, current.get(r.replica_id.to_full_id_str())) for r in replicas]

    monkeypatch.setattr("serve_app.routing.fuzz_router.probe_queue_lens", probe)
    return current


def route(request, router=None, **state) -> str:
    if router is None:
        router = FuzzAffinityRouter.__new__(FuzzAffinityRouter)
        router.initialize_state(**state)
    [[chosen]] = asyncio.run(router.choose_replicas(REPLICAS, request))
    return chosen.replica_id.to_full_id_str()


REQ = pending(prompt="count 1 2 3 " * 50, vllm_xargs={"fuzz_strength": 0.5})
REQ_KEY = routing_key(REQ, 512)
assert REQ_KEY is not None, "REQ has a prompt: it has a key"
PREFERRED = rendezvous(REQ_KEY, ["A", "B"])
OTHER = "B" if PREFERRED == "A" else "A"


@pytest.mark.parametrize(
    "threshold, lens",
    [
        (8, {"A": 0, "B": 0}),
        (8, {"A": 20, "B": 20}),
        (8, {PREFERRED: 10, OTHER: 2}),
        (None, {PREFERRED: 50, OTHER: 0}),  # affinity alone
    ],
)
def test_router_keeps_affinity_while_balanced(threshold, lens, queue_lens):
    queue_lens.update(lens)
    assert route(REQ, imbalanced_threshold=threshold) == PREFERRED


def test_router_falls_back_to_the_least_loaded_and_balances_keyless_requests(queue_lens):
    queue_lens.update({PREFERRED: 30, OTHER: 2})
    assert route(REQ) == OTHER
    queue_lens.update({PREFERRED: None})  # did not answer the probe in time
    assert route(REQ) == OTHER
    for light, heavy in (("A", "B"), ("B", "A")):  # no prompt (GET /ready through HAProxy): load alone
        queue_lens.update({light: 0, heavy: 3})
        assert route(types.SimpleNamespace(args=[])) == light


def new_router(**state) -> FuzzAffinityRouter:
    router = FuzzAffinityRouter.__new__(FuzzAffinityRouter)
    router.initialize_state(**state)
    return router


async def pick(router, request=REQ) -> str:
    [[chosen]] = await router.choose_replicas(REPLICAS, request)
    return chosen.replica_id.to_full_id_str()


def test_between_probes_the_router_counts_what_it_routed(queue_lens, monkeypatch):
    """Probes are rationed (probe_interval_s); meanwhile each request routed counts on its replica, so a
    burst for one key spreads once the preferred replica runs the threshold ahead, and a new probe resets."""
    import serve_app.routing.fuzz_router as routing

    clock = [100.0]
    monkeypatch.setattr(routing.time, "monotonic", lambda: clock[0])
    probes = []
    real = routing.probe_queue_lens

    async def counted(router, replicas):
        probes.append(clock[0])
        return await real(router, replicas)

    monkeypatch.setattr(routing, "probe_queue_lens", counted)
    queue_lens.update({"A": 0, "B": 0})

    async def scenario():
        router = new_router(imbalanced_threshold=2, probe_interval_s=0.1)
        burst = [await pick(router) for _ in range(6)]
        assert probes == [100.0], "one probe for the whole burst"
        assert burst[:3] == [PREFERRED] * 3 and OTHER in burst[3:], burst
        clock[0] += 0.2
        await pick(router)  # routed on the counts it has; the stale view starts one refresh
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert probes == [100.0, 100.2] and router._lens == {"A": 0, "B": 0}, "a fresh probe: both at 0 again"

    asyncio.run(scenario())


def test_probes_are_single_flight_and_never_block_a_known_view(queue_lens, monkeypatch):
    """Many concurrent requests share one probe; once every replica has answered one, a slow probe (a busy
    replica) does not hold up routing: a request that waited for a probe of its own would make every route
    call as slow as the busiest replica's answer."""
    import serve_app.routing.fuzz_router as routing

    calls: list[int] = []
    gate: asyncio.Event | None = None

    async def slow(router, replicas):
        calls.append(len(replicas))
        assert gate is not None  # scenario() sets it before the first probe
        await gate.wait()
        return [(r, 0) for r in replicas]

    monkeypatch.setattr(routing, "probe_queue_lens", slow)

    async def scenario():
        nonlocal gate
        gate = asyncio.Event()
        router = new_router(probe_interval_s=0)
        first = [asyncio.create_task(pick(router)) for _ in range(20)]
        await asyncio.sleep(0.01)
        assert calls == [2] and not any(t.done() for t in first), "nothing known yet: all wait for one probe"
        gate.set()
        assert len(await asyncio.gather(*first)) == 20 and calls == [2]
        gate.clear()  # every later probe hangs
        picks = await asyncio.wait_for(asyncio.gather(*(pick(router) for _ in range(20))), 1.0)
        assert len(picks) == 20 and calls == [2, 2], "one refresh in flight, nobody waited for it"
        gate.set()

    asyncio.run(scenario())


def test_after_an_idle_spell_old_counts_are_not_routed_on(queue_lens, monkeypatch):
    """Counts older than max_view_age_s are refreshed before routing: the last burst's counts (the home
    replica busy) must not send the first request after an idle spell away from its home replica. Routing
    on them is what failed the Serve routing-property test in a clean-clone CI."""
    import serve_app.routing.fuzz_router as routing

    clock = [100.0]
    monkeypatch.setattr(routing.time, "monotonic", lambda: clock[0])

    async def scenario():
        router = new_router(probe_interval_s=0.1, max_view_age_s=1.0)
        queue_lens.update({PREFERRED: 30, OTHER: 0})
        assert await pick(router) == OTHER, "busy home replica: the least-loaded one takes it"
        queue_lens.update({PREFERRED: 0, OTHER: 0})  # the burst is over; nobody asked since
        clock[0] += 1.5
        assert await pick(router) == PREFERRED, "an old view waits for a fresh probe"

    asyncio.run(scenario())


def test_a_failed_probe_routes_on_affinity_and_does_not_block(monkeypatch):
    """A probe that raises (a replica gone mid-RPC) leaves no count known: requests go to their home
    replica, and the router does not wait for another probe on every request."""
    import serve_app.routing.fuzz_router as routing

    calls = []

    async def broken(router, replicas):
        calls.append(1)
        raise RuntimeError("replica actor died")

    monkeypatch.setattr(routing, "probe_queue_lens", broken)

    async def scenario():
        router = new_router(probe_interval_s=10, max_view_age_s=10)
        assert [await pick(router) for _ in range(5)] == [PREFERRED] * 5
        assert calls == [1], "one failed probe, then routed on affinity until the next interval"

    asyncio.run(scenario())


def test_router_refuses_nonsense_and_handles_no_replicas():
    router = FuzzAffinityRouter.__new__(FuzzAffinityRouter)
    router.initialize_state()
    assert asyncio.run(router.choose_replicas([], REQ)) == []
    with pytest.raises(ValueError, match="prefix_chars"):
        router.initialize_state(prefix_chars=0)
    with pytest.raises(ValueError, match="probe_interval_s"):
        router.initialize_state(probe_interval_s=-1)
    with pytest.raises(ValueError, match="max_view_age_s"):
        router.initialize_state(probe_interval_s=1, max_view_age_s=0.5)


@pytest.mark.parametrize("xargs", [{"fuzz_strength": 10**400}, {"fuzz_strength": "x"}, {"fuzz_seed": 2**70}, [1]])
def test_the_routing_key_of_a_bad_value_is_the_neutral_one(xargs):
    """The router never raises on a client's value: it routes the request as neutral, and the replica refuses it."""
    assert affinity_key("abc", xargs) == "abc"
