"""Validation of per-request fuzz settings (pure logic)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patches.definitions.fuzz_params import (
    MAX_STRENGTH,
    NEUTRAL,
    FuzzParamError,
    FuzzSpec,
    LayerReport,
    parse_fuzz_args,
    parse_or_neutral,
    resolve_layer,
)


@pytest.mark.parametrize(
    "xargs, field",
    [
        ({"fuzz_strength": -0.1}, "fuzz_strength"),
        ({"fuzz_strength": float("nan")}, "fuzz_strength"),
        ({"fuzz_strength": float("inf")}, "fuzz_strength"),
        ({"fuzz_strength": -float("inf")}, "fuzz_strength"),
        ({"fuzz_strength": "0.5"}, "fuzz_strength"),
        ({"fuzz_strength": None}, "fuzz_strength"),
        ({"fuzz_strength": True}, "fuzz_strength"),
        ({"fuzz_strength": [1]}, "fuzz_strength"),
        ({"fuzz_strength": MAX_STRENGTH * 2}, "fuzz_strength"),
        ({"fuzz_strength": 1, "fuzz_mode": "uniform"}, "fuzz_mode"),
        ({"fuzz_strength": 1, "fuzz_mode": 3}, "fuzz_mode"),
        ({"fuzz_strength": 1, "fuzz_seed": 1.5}, "fuzz_seed"),
        ({"fuzz_strength": 1, "fuzz_seed": 2.0}, "fuzz_seed"),
        ({"fuzz_strength": 1, "fuzz_seed": "7"}, "fuzz_seed"),
        ({"fuzz_strength": 1, "fuzz_seed": False}, "fuzz_seed"),
        ({"fuzz_strength": 1, "fuzz_seed": 2**64}, "fuzz_seed"),
        ({"fuzz_strenght": 1}, "fuzz_strenght"),
        ({"fuzz_level": 1}, "fuzz_level"),
    ],
)
def test_bad_values_name_the_field(xargs, field):
    with pytest.raises(FuzzParamError) as ei:
        parse_fuzz_args(xargs)
    assert ei.value.field == field
    assert field in str(ei.value)


def test_defaults_and_unrelated_keys():
    assert parse_fuzz_args(None) is NEUTRAL
    assert parse_fuzz_args({}) is NEUTRAL
    assert parse_fuzz_args({"other_feature": 1}) == NEUTRAL
    spec = parse_fuzz_args({"fuzz_strength": 3, "fuzz_mode": "gaussian", "fuzz_seed": -5})
    assert spec == FuzzSpec(3.0, "gaussian", -5)
    assert spec.noise_std == 3.0 and spec.scale_multiplier == 1.0


def test_scale_semantics():
    assert parse_fuzz_args({"fuzz_strength": 0}).scale_multiplier == 1.0
    assert parse_fuzz_args({"fuzz_strength": 0.25}).scale_multiplier == 0.75
    assert parse_fuzz_args({"fuzz_strength": 1}).scale_multiplier == 0.0
    assert parse_fuzz_args({"fuzz_strength": 7.5}).scale_multiplier == 0.0
    assert parse_fuzz_args({"fuzz_strength": 7.5}).noise_std == 0.0


def test_cache_salt_separates_distinct_perturbations():
    salt = lambda x: parse_fuzz_args(x).cache_salt()  # noqa: E731
    assert salt({"fuzz_strength": 0}) is None
    assert salt({"fuzz_strength": 0, "fuzz_mode": "gaussian", "fuzz_seed": 3}) is None
    assert salt({"fuzz_strength": 0.5}) != salt({"fuzz_strength": 0.6})
    # every s >= 1 zeroes the embeddings in scale mode: one salt
    assert salt({"fuzz_strength": 1}) == salt({"fuzz_strength": 4})
    # scale mode ignores the seed; gaussian does not
    assert salt({"fuzz_strength": 0.5, "fuzz_seed": 1}) == salt({"fuzz_strength": 0.5, "fuzz_seed": 2})
    g = lambda s, seed: salt({"fuzz_strength": s, "fuzz_mode": "gaussian", "fuzz_seed": seed})  # noqa: E731
    assert g(1, 1) != g(1, 2) != g(2, 2)
    assert g(1, 1) != salt({"fuzz_strength": 1})


def test_parse_or_neutral_never_raises():
    spec, err = parse_or_neutral({"fuzz_strength": "bad"})
    assert spec is NEUTRAL and isinstance(err, FuzzParamError)


@pytest.mark.parametrize("x", [10**400, -(10**400), 10**308 * 10, 2**1024])
def test_an_integer_beyond_floats_range_names_the_field_without_echoing_it(x):
    with pytest.raises(FuzzParamError) as e:
        parse_fuzz_args({"fuzz_strength": x})
    assert e.value.field == "fuzz_strength" and "digits" in str(e.value) and str(x) not in str(e.value)
    spec, err = parse_or_neutral({"fuzz_strength": x})
    assert spec is NEUTRAL and err is not None


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.integers(10**300, 10**1000)))
def test_any_number_is_accepted_iff_finite_and_in_range(x):
    ok = (isinstance(x, int) or math.isfinite(x)) and 0 <= x <= MAX_STRENGTH  # int vs float compares exactly
    try:
        spec = parse_fuzz_args({"fuzz_strength": x})
    except FuzzParamError as e:
        assert not ok and e.field == "fuzz_strength"
    else:
        assert ok and spec.strength == float(x) and 0.0 <= spec.scale_multiplier <= 1.0


# --------------------------------------------------------------------------- depth, scope and schedule


@pytest.mark.parametrize(
    "xargs, field",
    [
        ({"fuzz_strength": 1, "fuzz_layer": 1.0}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_layer": "2"}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_layer": True}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_layer": 10**6}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_layer": -(10**6)}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_tokens": "output"}, "fuzz_tokens"),
        ({"fuzz_strength": 1, "fuzz_tokens": ["prompt"]}, "fuzz_tokens"),
        ({"fuzz_strength": 1, "fuzz_strength_end": -1}, "fuzz_strength_end"),
        ({"fuzz_strength": 1, "fuzz_strength_end": "1"}, "fuzz_strength_end"),
        ({"fuzz_strength": 1, "fuzz_strength_end": None}, "fuzz_strength_end"),
        ({"fuzz_strength": 1, "fuzz_strength_end": MAX_STRENGTH + 1}, "fuzz_strength_end"),
        ({"fuzz_strength": 1, "fuzz_strength_end": 2, "fuzz_ramp_tokens": -1}, "fuzz_ramp_tokens"),
        ({"fuzz_strength": 1, "fuzz_strength_end": 2, "fuzz_ramp_tokens": 2.5}, "fuzz_ramp_tokens"),
        ({"fuzz_strength": 1, "fuzz_strength_end": 2, "fuzz_ramp_tokens": 10**9}, "fuzz_ramp_tokens"),
        ({"fuzz_strength": 1, "fuzz_ramp_tokens": 4}, "fuzz_ramp_tokens"),  # a ramp to nowhere
        ({"fuzz_strength": 1, "fuzz_layers": 2}, "fuzz_layers"),
    ],
)
def test_bad_depth_scope_and_schedule_values_name_the_field(xargs, field):
    with pytest.raises(FuzzParamError) as ei:
        parse_fuzz_args(xargs)
    assert ei.value.field == field and field in str(ei.value)


def test_a_huge_integer_is_not_echoed_back():
    with pytest.raises(FuzzParamError) as ei:
        parse_fuzz_args({"fuzz_strength": 1, "fuzz_layer": 10**500})
    assert "digits" in str(ei.value) and str(10**500) not in str(ei.value)


def test_strength_at_follows_the_definition():
    ramp = parse_fuzz_args({"fuzz_strength": 1.0, "fuzz_strength_end": 3.0, "fuzz_ramp_tokens": 4})
    # prompt of 10 tokens: positions 0-9 prompt (strength 1), then generated tokens g = 0, 1, ... ramp to 3 at g = 4
    assert [ramp.strength_at(p, 10) for p in (0, 9, 10, 11, 12, 13, 14, 15, 99)] == [
        1.0,
        1.0,
        1.0,
        1.5,
        2.0,
        2.5,
        3.0,
        3.0,
        3.0,
    ]
    step = parse_fuzz_args({"fuzz_strength": 0.5, "fuzz_strength_end": 2.0, "fuzz_ramp_tokens": 0})
    assert [step.strength_at(p, 3) for p in (2, 3, 4)] == [0.5, 2.0, 2.0]
    prompt = parse_fuzz_args({"fuzz_strength": 0.5, "fuzz_tokens": "prompt"})
    generated = parse_fuzz_args({"fuzz_strength": 0.5, "fuzz_tokens": "generated"})
    assert [prompt.strength_at(p, 3) for p in (0, 2, 3, 7)] == [0.5, 0.5, 0.0, 0.0]
    assert [generated.strength_at(p, 3) for p in (0, 2, 3, 7)] == [0.0, 0.0, 0.5, 0.5]


@pytest.mark.parametrize(
    "xargs, neutral",
    [
        ({"fuzz_strength": 0, "fuzz_layer": 2}, True),
        ({"fuzz_strength": 0, "fuzz_strength_end": 1}, False),  # ramps up from 0
        ({"fuzz_strength": 0, "fuzz_strength_end": 1, "fuzz_tokens": "prompt"}, True),  # the ramp is on generated
        ({"fuzz_strength": 1, "fuzz_strength_end": 0, "fuzz_ramp_tokens": 0, "fuzz_tokens": "generated"}, True),
        ({"fuzz_strength": 1, "fuzz_strength_end": 0, "fuzz_ramp_tokens": 3, "fuzz_tokens": "generated"}, False),
        ({"fuzz_strength": 1, "fuzz_tokens": "generated"}, False),
    ],
)
def test_a_request_is_neutral_exactly_when_no_token_gets_a_strength(xargs, neutral):
    spec = parse_fuzz_args(xargs)
    assert spec.is_neutral is neutral
    # the property against the definition, over prompt and generated positions
    assert (max(spec.strength_at(p, 5) for p in range(40)) == 0.0) is neutral
    assert (spec.cache_salt() is None) is neutral


def test_every_new_key_changes_the_salt_and_the_old_salts_stay():
    salt = lambda x: parse_fuzz_args(x).cache_salt()  # noqa: E731
    base = {"fuzz_strength": 0.5}
    assert salt(base) == "fuzz:scale:0.5"  # what a request without the new keys was salted with before them
    variants = [
        {**base, "fuzz_layer": 1},
        {**base, "fuzz_layer": 2},
        {**base, "fuzz_layer": -1},
        {**base, "fuzz_tokens": "prompt"},
        {**base, "fuzz_tokens": "generated"},
        {**base, "fuzz_strength_end": 1.0},
        {**base, "fuzz_strength_end": 1.0, "fuzz_ramp_tokens": 4},
        {**base, "fuzz_strength_end": 1.0, "fuzz_ramp_tokens": 5},
        {**base, "fuzz_strength_end": 0.9, "fuzz_ramp_tokens": 4},
    ]
    salts = [salt(v) for v in variants]
    assert salt(base) not in salts and len(set(salts)) == len(salts)
    # the defaults spelled out are the defaults
    assert salt({**base, "fuzz_layer": 0, "fuzz_tokens": "all"}) == salt(base)
    # scale strengths above 1 differ once a ramp interpolates them
    assert salt({"fuzz_strength": 2, "fuzz_strength_end": 0}) != salt({"fuzz_strength": 3, "fuzz_strength_end": 0})


def test_only_scopes_and_ramps_depend_on_the_prompt_length():
    dep = lambda x: parse_fuzz_args(x).depends_on_prompt_length  # noqa: E731
    assert not dep({"fuzz_strength": 0.5}) and not dep({"fuzz_strength": 0.5, "fuzz_layer": 3})
    assert dep({"fuzz_strength": 0.5, "fuzz_tokens": "prompt"})
    assert dep({"fuzz_strength": 0.5, "fuzz_strength_end": 1})
    assert not dep({"fuzz_strength": 0, "fuzz_tokens": "prompt"})  # neutral: no salt at all


@pytest.mark.parametrize(
    "layer, point", [(0, 0), (1, 1), (4, 4), (5, None), (-1, 4), (-4, 1), (-5, 0), (-6, None), (100, None)]
)
def test_resolve_layer_counts_negative_values_from_the_end(layer, point):
    assert resolve_layer(layer, 4) == point


def test_the_layer_report_refuses_what_the_model_cannot_serve():
    ok = LayerReport(4)
    spec = lambda layer: parse_fuzz_args({"fuzz_strength": 1, "fuzz_layer": layer})  # noqa: E731
    assert ok.refusal(spec(0)) is None and ok.refusal(spec(4)) is None and ok.refusal(spec(-5)) is None
    err = ok.refusal(spec(5))
    assert err is not None and err.field == "fuzz_layer" and "between -5 and 4" in str(err) and "4 decoder" in str(err)
    err = ok.refusal(parse_fuzz_args({"fuzz_strength": 0, "fuzz_layer": 9}))  # neutral, still a mistake
    assert err is not None
    unreachable = LayerReport(4, "no single list of 4 decoder layers")
    assert unreachable.refusal(spec(0)) is None
    err = unreachable.refusal(spec(1))
    assert err is not None and err.field == "fuzz_layer" and "no single list" in str(err)
