"""The fuzz matrix's CI part: real vLLM engines on architectures users bring, against an independent reference.

The whole matrix (every architecture, eager and compiled) is one command,
``python -m patches.matrix``, with its last run's table in docs/fuzz.md; it
takes about 25 minutes on 2 cores. CI runs the part that proves what broke:
an architecture vLLM serves through its Transformers modeling backend
(OLMo2), eager and compiled, equal to the reference in every request of one
mixed batch; the same engine with the fuzz patch off, which the matrix must
fail (the positive control: it sees a missing perturbation); and a model
whose forward bypasses its embedding module, which the patch's start-up
self-test must refuse (an engine that would answer fuzz requests unfuzzed
never serves). The native path (Llama) is proven against stock vLLM by
tests/test_fuzz_engine.py and tests/test_fuzz_compiled.py.
"""

from __future__ import annotations

import pytest

from patches.matrix.__main__ import markdown
from patches.matrix.architectures import build
from patches.matrix.run import EngineRefused, run_architecture, serve
from testkit import broken_embedding

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_transformers_backend_fuzzes_as_the_reference(mode):
    r = run_architecture("olmo2", mode)
    assert r.backend == "transformers"
    assert r.ok, markdown([r], "olmo2") + "\n".join(str(c) for c in r.cases if not c.ok)
    assert r.counts()["equal"] == len(r.cases), "every request equal, no near-tie, on this model"


def test_the_matrix_fails_with_the_fuzz_patch_off():
    """The control: the same engine with the fuzz patch switched off serves every fuzzed request unperturbed, and
    the matrix sees each one; its neutral requests still agree with the reference (the check is not just noisy)."""
    r = run_architecture("olmo2", "eager", patches_off="fuzz")
    assert not r.ok
    for c in r.cases:
        neutral = c.label.endswith((" none", " scale 0"))
        assert c.verdict == ("equal" if neutral else "differs"), c


def test_a_model_whose_forward_bypasses_its_embedding_is_refused_at_start(tmp_path):
    path = broken_embedding.checkpoint(build("llama"), broken_embedding.BYPASS, tmp_path / "model")
    with pytest.raises(EngineRefused, match="does not read the perturbed output of its input embedding"):
        serve(
            path,
            "eager",
            [[1, 5, 6, 7]],
            setup="testkit.broken_embedding:register",
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},  # the model is registered in this one process
            workdir=tmp_path / "work",
            timeout=600,
        )
    # the same model served with the fuzz patch off starts and answers (the refusal is the patch's, and it says so)
    out = serve(
        path,
        "eager",
        [[1, 5, 6, 7]],
        patches_off="fuzz",
        setup="testkit.broken_embedding:register",
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        workdir=tmp_path / "work-off",
        timeout=600,
    )
    assert all(len(c["tokens"]) == 8 for c in out["passes"][0])
