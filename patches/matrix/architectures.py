"""The architectures of the fuzz matrix: tiny random models of the families users serve, built locally.

Each entry is a transformers config class with the smallest shape vLLM's CPU
backend takes (hidden 128, head_dim 64: the CPU attention refuses 16), with 4
decoder layers (so that ``fuzz_layer`` 1, L/2 and -1 are three different
depths) over a word-level tokenizer built here (no model hub is reachable;
:func:`build_tokenizer`, the fixture model's vocabulary). Every other
setting is the family's default, so a model ties or unties its embeddings,
scales them (Gemma's ``sqrt(hidden)``, Granite's ``embedding_multiplier``),
adds learned positions (GPT-2, OPT) or normalises them as the real checkpoints
of that family do.

``backend`` is where vLLM 0.32 runs the architecture: ``native`` (a vLLM model
file) or ``transformers`` (its Transformers modeling backend,
``vllm.model_executor.models.registry._TRANSFORMERS_SUPPORTED_MODELS``, which
calls the Hugging Face model's own forward with a batch dimension added). The
matrix checks that vLLM agrees (:func:`resolved_backend`), so an upgrade that
moves a family from one backend to the other shows up as a failed row, not a
silently different proof.

Random weights use a larger initializer range than the families' 0.02, so the
greedy choice of a random model is decided by a margin well above float32
noise (at 0.02 a 2-layer random model's logits are nearly flat, and two
correct implementations disagree on near-ties).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HIDDEN = 128
LAYERS = 4
HEADS = 2
HEAD_DIM = 64
FFN = 256
MAX_POS = 1024
INIT_RANGE = 0.2
SEED = 0

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "models" / "matrix"


@dataclass(frozen=True)
class Architecture:
    """One family: its transformers config class, the keyword arguments that make it tiny, and vLLM's backend."""

    name: str
    config_class: str
    backend: str  # "native" or "transformers"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Where the Hugging Face model keeps its decoder layers, written down per family for the reference (never found
    # by a search, so that the reference does not share the patch's way of finding them).
    layers: str = "model.layers"


def _decoder(**extra: Any) -> dict[str, Any]:
    """Llama-style keyword arguments (most families share these names)."""
    base: dict[str, Any] = dict(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=1,
        max_position_embeddings=MAX_POS,
    )
    return {**base, **extra}


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("llama", "LlamaConfig", "native", _decoder(head_dim=HEAD_DIM)),
        Architecture("qwen2", "Qwen2Config", "native", _decoder()),
        Architecture("qwen3", "Qwen3Config", "native", _decoder(head_dim=HEAD_DIM)),
        Architecture("mistral", "MistralConfig", "native", _decoder(head_dim=HEAD_DIM)),
        Architecture("gemma", "GemmaConfig", "native", _decoder(head_dim=HEAD_DIM)),
        Architecture("gemma2", "Gemma2Config", "native", _decoder(head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM)),
        Architecture("phi3", "Phi3Config", "native", _decoder()),
        # Granite's muP multipliers: the embeddings x 12 and the attention scaled by 1/head_dim, which *replaces*
        # 1/sqrt(head_dim) (the config class's default of 1.0 left the random model's attention logits 8x a
        # checkpoint's, so peaked that float32 rounding alone moved its log-probs past the judge's bound: the
        # results log, 2026-12-07)
        Architecture(
            "granite",
            "GraniteConfig",
            "native",
            _decoder(embedding_multiplier=12.0, attention_multiplier=1.0 / HEAD_DIM),
        ),
        Architecture(
            "gpt2",
            "GPT2Config",
            "native",
            dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, n_positions=MAX_POS),
            layers="transformer.h",
        ),
        Architecture(
            "opt",
            "OPTConfig",
            "native",
            dict(
                hidden_size=HIDDEN,
                ffn_dim=FFN,
                num_hidden_layers=LAYERS,
                num_attention_heads=HEADS,
                word_embed_proj_dim=HIDDEN,
                max_position_embeddings=MAX_POS,
            ),
            layers="model.decoder.layers",
        ),
        Architecture(
            "gpt_neox",
            "GPTNeoXConfig",
            "transformers",
            dict(
                hidden_size=HIDDEN,
                intermediate_size=FFN,
                num_hidden_layers=LAYERS,
                num_attention_heads=HEADS,
                max_position_embeddings=MAX_POS,
            ),
            layers="gpt_neox.layers",
        ),
        Architecture("phi", "PhiConfig", "transformers", _decoder(num_key_value_heads=HEADS)),
        Architecture("olmo2", "Olmo2Config", "transformers", _decoder()),
        Architecture("smollm3", "SmolLM3Config", "transformers", _decoder()),
    )
}


# The fixture model's vocabulary (fixture_model/tasks.py), rebuilt here because the plugin package imports nothing of
# the project: special tokens, then task keywords, letters and the numbers 0-199, one id each. The same ids as the
# fixture's tokenizer, so the matrix's checkpoints and prompts are the ones its runs were measured with.
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
WORDS: tuple[str, ...] = (
    *("count", "abc", "copy", "=", ".", "user", "assistant", "system", ":"),
    *string.ascii_lowercase,
    *(str(i) for i in range(200)),
)


def build_tokenizer():
    """A word-level fast tokenizer over :data:`WORDS`; every sequence starts with ``<s>``.

    Metaspace pre-tokenization (as SentencePiece models do) lets vLLM's
    detokenizer put the spaces back.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in WORDS:
        vocab.setdefault("\u2581" + w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POS,
    )


def _fingerprint(arch: Architecture, init_range: float) -> str:
    spec = {
        "arch": [arch.name, arch.config_class, arch.kwargs],
        "init": [init_range, SEED],
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


def model_dir(name: str, init_range: float = INIT_RANGE, cache: Path = CACHE) -> Path:
    """The checkpoint directory of architecture ``name`` (built by :func:`build`)."""
    arch = ARCHITECTURES[name]
    return cache / f"{arch.name}-{_fingerprint(arch, init_range)}"


def build(name: str, init_range: float = INIT_RANGE, cache: Path = CACHE) -> Path:
    """Build (or reuse) the tiny random checkpoint of architecture ``name``; returns its directory.

    ``init_range``: the weights' initializer range (the families' own default
    is 0.02; the matrix uses :data:`INIT_RANGE`, see the module docstring).

    Deterministic (fixed seed, CPU, float32) and cached by a fingerprint of
    the architecture and of this file. Written to a temporary directory and
    renamed, so an interrupted build never leaves a half checkpoint behind.
    """
    out = model_dir(name, init_range, cache)
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    arch = ARCHITECTURES[name]
    tokenizer = build_tokenizer()
    config_cls = getattr(transformers, arch.config_class)
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=init_range,
        **arch.kwargs,
    )
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    log.info("matrix: built %s (%s) at %s", name, arch.config_class, out)
    return out


def resolved_backend(model_path: str | Path) -> str:
    """Where vLLM would run this checkpoint: ``native`` or ``transformers`` (its Transformers modeling backend)."""
    from vllm.model_executor.models.registry import _TRANSFORMERS_SUPPORTED_MODELS, ModelRegistry

    config = json.loads((Path(model_path) / "config.json").read_text())
    archs = config.get("architectures") or []
    if any(a in _TRANSFORMERS_SUPPORTED_MODELS for a in archs):
        return "transformers"
    if any(a in ModelRegistry.get_supported_archs() for a in archs):
        return "native"
    return "transformers"  # vLLM's fallback for an architecture it does not know
