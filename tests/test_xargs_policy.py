"""The guard's vllm_xargs policy (pure logic)."""

import pytest

from serve_app.ingress.xargs_policy import RESERVED_KEYS, RequestRejected, XargsPolicy, check_xargs


def test_fuzz_keys_pass_validated():
    fwd, spec = check_xargs({"fuzz_strength": 2, "fuzz_mode": "gaussian", "fuzz_seed": 5})
    assert fwd == {"fuzz_strength": 2, "fuzz_mode": "gaussian", "fuzz_seed": 5}
    assert spec.noise_std == 2.0
    assert check_xargs(None) == (None, spec.__class__())
    assert check_xargs({})[0] is None


@pytest.mark.parametrize("key", RESERVED_KEYS)
def test_reserved_keys_are_refused_or_stripped(key):
    with pytest.raises(RequestRejected) as ei:
        check_xargs({key: {"do_remote_prefill": True}, "fuzz_strength": 1})
    assert ei.value.param == f"vllm_xargs.{key}" and ei.value.status_code == 400
    fwd, _ = check_xargs({key: 1, "fuzz_strength": 1}, XargsPolicy(reserved="strip"))
    assert fwd == {"fuzz_strength": 1}


@pytest.mark.parametrize(
    "xargs, param",
    [
        ({"fuzz_strength": -1}, "vllm_xargs.fuzz_strength"),
        ({"fuzz_strength": float("nan")}, "vllm_xargs.fuzz_strength"),
        ({"fuzz_mode": "x", "fuzz_strength": 1}, "vllm_xargs.fuzz_mode"),
        ({"fuzz_seed": "1", "fuzz_strength": 1}, "vllm_xargs.fuzz_seed"),
        ({"fuzz_strenght": 1}, "vllm_xargs.fuzz_strenght"),
        ({"temperature_boost": 1}, "vllm_xargs.temperature_boost"),
        ([1, 2], "vllm_xargs"),
    ],
)
def test_bad_requests_name_the_field(xargs, param):
    with pytest.raises(RequestRejected) as ei:
        check_xargs(xargs)
    body = ei.value.body()["error"]
    assert body["param"] == param and body["code"] == 400 and body["type"] == "invalid_request_error"
    assert param.split(".")[-1] in body["message"]


def test_extra_keys_can_be_allowed():
    fwd, _ = check_xargs({"my_feature": 3}, XargsPolicy(allowed_extra_keys=("my_feature",)))
    assert fwd == {"my_feature": 3}


def test_request_body_top_level_reserved_fields():
    from serve_app.ingress.xargs_policy import check_request_body

    body = {"model": "m", "prompt": "p", "vllm_xargs": {"fuzz_strength": 0.5}}
    assert check_request_body(body) == (body, check_xargs({"fuzz_strength": 0.5})[1], False)
    with pytest.raises(RequestRejected) as ei:
        check_request_body({**body, "kv_transfer_params": {"do_remote_decode": True}})
    assert ei.value.param == "kv_transfer_params"
    out, _, changed = check_request_body({**body, "ec_transfer_params": {}}, XargsPolicy(reserved="strip"))
    assert changed and out == body
    # null is what clients send for "unset": not a violation
    assert check_request_body({**body, "kv_transfer_params": None})[2] is False


@pytest.mark.parametrize("value", [10**400, -(10**400)])
def test_an_integer_beyond_floats_range_gets_the_guards_400_naming_the_field(value):
    with pytest.raises(RequestRejected) as e:
        check_xargs({"fuzz_strength": value})
    assert e.value.param == "vllm_xargs.fuzz_strength" and e.value.status_code == 400
    assert str(value) not in e.value.message
