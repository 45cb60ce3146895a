"""The cache salt the engine keys KV on (patches/fuzz.py ``salted``): no client salt reaches another's KV.

Pure logic. The engine test (tests/test_fuzz_engine.py,
test_a_client_salt_cannot_plant_kv_under_a_fuzz_salt) checks the same on a
real engine's prefix cache.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from patches.definitions.fuzz_params import NEUTRAL, FuzzSpec
from patches.fuzz import salted

specs = st.one_of(
    st.just(NEUTRAL),
    st.builds(
        FuzzSpec,
        strength=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
        mode=st.sampled_from(["scale", "gaussian"]),
        seed=st.integers(-3, 3),
    ),
)
# client salts, including ones shaped like the engine's own salts
salts = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.sampled_from(
        [
            "fuzz:scale:1.0",
            "fuzz:gaussian:2.0:1",
            "client:3:abc",
            "client:3:abc|fuzz:scale:1.0",
            "x|fuzz:scale:0.5",
            "|",
        ]
    ),
)


@given(salts, specs, salts, specs)
def test_two_requests_share_a_salt_only_with_the_same_client_salt_and_perturbation(a, sa, b, sb):
    if salted(a, sa) == salted(b, sb):
        assert (a or None) == (b or None)
        assert sa.cache_salt() == sb.cache_salt()


def test_a_neutral_request_cannot_take_a_fuzz_salt():
    fuzzed = FuzzSpec(strength=1.0, mode="scale")
    planted = fuzzed.cache_salt()  # the public string, e.g. "fuzz:scale:1.0"
    assert planted is not None
    assert salted(planted, NEUTRAL) != salted(None, fuzzed)
    assert salted("x|" + planted, NEUTRAL) != salted("x", fuzzed)
    # what the engine sees
    assert salted(None, NEUTRAL) is None
    assert salted("", NEUTRAL) is None
    assert salted(None, fuzzed) == planted
    assert salted("abc", NEUTRAL) == "client:3:abc"
    assert salted("abc", fuzzed) == f"client:3:abc|{planted}"
