"""Validation of per-request fuzz settings (pure logic)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from patches.fuzz_params import MAX_STRENGTH, NEUTRAL, FuzzParamError, FuzzSpec, parse_fuzz_args, parse_or_neutral


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
