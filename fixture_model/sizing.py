"""An untrained Llama of a chosen width and depth, with the fixture tokenizer.

    python -m fixture_model.sizing --hidden 1024 --layers 4

Prints the checkpoint directory. For benchmarks that need a model's
*compute* rather than its answers: the fixture model (hidden 128, 2 layers)
is so small that anything done per token per hidden dim (the fuzz patch's
noise, for one) is a visible share of a step, where on a real model it is
not. Whether that argument holds is measured, not assumed: run the patch
overhead benchmark on one of these (``python -m benchmarks.patch_overhead
--arch 1024x4``).

The weights are random (seeded, so a build is reproducible) and the text is
noise; benchmarks use ``ignore_eos`` and count tokens, not answers. Nothing is
trained, so a build takes seconds. Cached by shape and by a hash of this file
and the fixture tokenizer's source.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
from pathlib import Path

from .build import ARCH, HERE, build_tokenizer, cache_dir

log = logging.getLogger("fixture_model.sizing")

HEAD_DIM = 64  # the CPU attention backend's supported head size (16 is refused)


def parse_arch(text: str) -> tuple[int, int]:
    """``"1024x4"`` -> (hidden size 1024, 4 layers); refuses what the CPU backend cannot run."""
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not m:
        raise ValueError(f"arch must look like HIDDENxLAYERS (e.g. 1024x4), got {text!r}")
    hidden, layers = int(m.group(1)), int(m.group(2))
    if hidden < HEAD_DIM or hidden % HEAD_DIM:
        raise ValueError(f"hidden size must be a positive multiple of {HEAD_DIM} (the head size), got {hidden}")
    if not 1 <= layers <= 64:
        raise ValueError(f"layers must be between 1 and 64, got {layers}")
    return hidden, layers


def config_for(hidden: int, layers: int) -> dict:
    """Llama proportions: head size 64, a quarter as many KV heads (GQA), MLP ~8/3 of the width."""
    heads = hidden // HEAD_DIM
    return {
        **ARCH,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": HEAD_DIM,
        "intermediate_size": 256 * max(1, round(hidden * 8 / 3 / 256)),
    }


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("sizing.py", "build.py", "tasks.py"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:12]


def ensure_sizing_model(hidden: int, layers: int, out: Path | None = None) -> Path:
    """Return the checkpoint directory of the (hidden, layers) model, building it first if needed."""
    out = Path(out) if out else cache_dir() / f"sizing-llama-{hidden}x{layers}-{_fingerprint()}"
    if out.exists():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    arch = config_for(hidden, layers)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # transformers' configs take extra keyword arguments (torch_dtype) at run time (@strict(accept_kwargs=True));
        # the type of their dataclass __init__ has no **kwargs.
        torch_dtype="float32",  # type: ignore[call-arg]
        **arch,
    )
    model = LlamaForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    log.info("building untrained sizing model %dx%d (%.1fM parameters) into %s", hidden, layers, params / 1e6, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "sizing_build.json").write_text(json.dumps({"arch": arch, "parameters": params, "trained": False}, indent=2))
    tmp.rename(out)  # atomic: a half-written directory is never picked up
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: cached by shape)")
    args = ap.parse_args(argv)
    # its own progress at INFO, every library from WARNING up (as load_tests.command_logs does for the others)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fixture_model").setLevel(logging.INFO)
    hidden, layers = parse_arch(f"{args.hidden}x{args.layers}")
    print(ensure_sizing_model(hidden, layers, args.out))


if __name__ == "__main__":
    main()
