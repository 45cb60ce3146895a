"""The fuzz matrix's CI part: real vLLM engines on architectures users bring, against an independent reference.

The whole matrix (every architecture, eager and compiled) is one command,
``python -m patches.matrix``, with its last run's table in docs/fuzz.md; it
takes about 30 minutes on 2 cores. Each engine serves one mixed batch of 152
requests: the embedding settings and, at layers 0, 1, L/2 and -1, each scope
in scale and gaussian mode and a ramp in each mode (``patches.matrix.run``).
CI runs the part that proves what broke: an architecture vLLM serves through
its Transformers modeling backend (OLMo2, whose layers return the residual
stream), eager and compiled, and a native one (Llama, whose layers return
vLLM's ``(hidden, residual)`` pair) compiled as the shipped config runs it,
each equal to the reference in every request; the controls, which the
matrix must fail: the engine with the fuzz patches off (every request that
the reference says a setting changes comes out ``differs``), the reference
planted one layer off (every layer case ``differs``); and a model whose
forward bypasses its embedding module, which the patch's start-up self-test
must refuse (an engine that would answer fuzz requests unfuzzed never
serves). The layer patch switched off (its settings refused, the row
failed) is in the hand-run matrix's controls (docs/fuzz.md).
"""

from __future__ import annotations

import pytest

from patches.matrix.__main__ import markdown
from patches.matrix.architectures import LAYERS, build
from patches.matrix.run import EngineRefused, cases_of, judge_served, run_architecture, serve, serve_architecture
from testkit import broken_embedding

pytestmark = pytest.mark.engine


def _depth(label: str) -> str:
    """A case's depth, from its label ("... layer -1 ..."; none: the embeddings)."""
    words = label.split()
    return words[words.index("layer") + 1] if "layer" in words else "0"


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_transformers_backend_fuzzes_as_the_reference(mode):
    r = run_architecture("olmo2", mode)
    assert r.backend == "transformers"
    assert r.ok, markdown([r], "olmo2") + "\n".join(str(c) for c in r.cases if not c.ok)
    assert r.counts()["equal"] == len(r.cases), "every request equal, no near-tie, on this model"
    assert {_depth(c.label) for c in r.cases} == {"0", "1", str(LAYERS // 2), "-1"}


def test_native_layers_fuzz_as_the_reference_compiled_and_one_layer_off_is_seen():
    """Llama's layers return vLLM's (hidden, residual) pair; compiled, as serve_config.yaml serves. The same
    engine's output judged against a reference planted one layer shallower must fail on every layer case (the
    matrix can tell layer k from layer k-1), and still pass every embedding case."""
    served = serve_architecture("llama", "compiled")
    r = judge_served(served)
    assert r.backend == "native"
    assert r.ok, markdown([r], "llama") + "\n".join(str(c) for c in r.cases if not c.ok)
    off = judge_served(served, layer_offset=-1)
    assert not off.ok
    for c in off.cases:
        assert c.verdict == ("equal" if _depth(c.label) == "0" else "differs"), c


def test_the_matrix_fails_with_the_fuzz_patches_off():
    """The control: the same engine with the fuzz patches switched off serves every fuzzed request unperturbed,
    and the matrix sees it wherever the setting changes the output; its neutral requests still agree with the
    reference (the check is not just noisy).

    Not every setting changes the output of a random model (a scale at the last layer is undone by the final
    norm): a request served unperturbed and judged equal is one whose setting the reference says changes nothing
    there. So the control asks that most fuzzed requests, at every depth, differ."""
    r = run_architecture("olmo2", "eager", patches_off="fuzz")
    assert not r.ok
    neutral = {c.label.split()[1]: c for c in r.cases if c.label.endswith((" none", " scale 0"))}
    assert neutral and all(c.verdict == "equal" for c in neutral.values())
    differs = [c for c in r.cases if c.verdict == "differs"]
    assert {_depth(c.label) for c in differs} == {"0", "1", str(LAYERS // 2), "-1"}, "missed at some depth"
    assert len(differs) >= 0.75 * (len(r.cases) - 2 * len(neutral)), r.counts()
    assert all(c.verdict in ("equal", "differs") for c in r.cases)


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


def test_a_model_whose_layers_cannot_be_told_apart_serves_with_fuzz_layer_refused(tmp_path):
    """Two lists hold the decoder layers: the layer patch cannot know which is the stack. The engine serves every
    request at the embeddings and refuses every other depth, saying why, before any of it is served."""
    path = broken_embedding.checkpoint(build("llama"), broken_embedding.TWO_STACKS, tmp_path / "model")
    out = serve(
        path,
        "eager",
        [[1, 5, 6, 7]],
        setup="testkit.broken_embedding:register",
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},  # the model is registered in this one process
        workdir=tmp_path / "work",
        timeout=600,
    )
    first = out["passes"][0]
    cases = cases_of(1)
    assert len(first) == len(cases)
    for (_p, fuzz), case in zip(cases, first, strict=True):
        if fuzz.layer and not fuzz.neutral:
            assert "no single list of 4 decoder layers" in case["refused"], case
            assert "model.layers" in case["refused"] and "model.mirror" in case["refused"]
        else:
            assert not case.get("refused") and len(case["tokens"]) == 8, (fuzz.label, case)
