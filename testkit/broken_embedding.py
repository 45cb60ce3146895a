"""Out-of-tree models the fuzz patch cannot perturb: the negative controls of its start-up checks.

Each is vLLM's own Llama with one change to how it reaches its input
embeddings, registered under an architecture name of its own
(:func:`register`, run in the engine's process before it starts, as a user's
plugin would), and served from a copy of the matrix's Llama checkpoint whose
``config.json`` names that architecture (:func:`checkpoint`):

``FuzzBypassLlamaForCausalLM``
    ``embed_input_ids`` runs ``model.embed_tokens`` (so the patch finds and
    swaps it), but ``forward`` looks the table up itself: every fuzz request
    would be served unfuzzed. The patch's start-up self-test must refuse it.
``FuzzNoModuleLlamaForCausalLM``
    ``embed_input_ids`` looks the table up itself, so no embedding module
    runs: the patch must refuse to start, naming the switch.
``FuzzTwoStacksLlamaForCausalLM``
    a second ``nn.ModuleList`` holds the same decoder layers (``model.mirror``),
    so the ``fuzz_layer`` patch cannot tell which list is the model's stack:
    the engine must serve, and refuse every ``fuzz_layer`` but 0 with a 400
    saying why (never 200 with output unperturbed at the layer asked for).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

BYPASS = "FuzzBypassLlamaForCausalLM"
NO_MODULE = "FuzzNoModuleLlamaForCausalLM"
TWO_STACKS = "FuzzTwoStacksLlamaForCausalLM"


def register() -> None:
    """Register both models with vLLM (in-process: the engine must run in this process)."""
    import torch
    from vllm import ModelRegistry
    from vllm.model_executor.models.llama import LlamaForCausalLM

    class FuzzBypassLlamaForCausalLM(LlamaForCausalLM):
        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            if inputs_embeds is None and input_ids is not None:
                inputs_embeds = torch.nn.functional.embedding(input_ids, self.model.embed_tokens.weight)
            return self.model(None, positions, intermediate_tensors, inputs_embeds)

    class FuzzNoModuleLlamaForCausalLM(LlamaForCausalLM):
        def embed_input_ids(self, input_ids, *args, **kwargs):
            return torch.nn.functional.embedding(input_ids, self.model.embed_tokens.weight)

    class FuzzTwoStacksLlamaForCausalLM(LlamaForCausalLM):
        def __init__(self, *, vllm_config, prefix: str = ""):  # vLLM reads this signature: keyword-only, by name
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.model.mirror = torch.nn.ModuleList(list(self.model.layers))  # the same layers, listed twice

    ModelRegistry.register_model(BYPASS, FuzzBypassLlamaForCausalLM)
    ModelRegistry.register_model(NO_MODULE, FuzzNoModuleLlamaForCausalLM)
    ModelRegistry.register_model(TWO_STACKS, FuzzTwoStacksLlamaForCausalLM)


def checkpoint(source: Path, architecture: str, out: Path) -> Path:
    """A copy of the Llama checkpoint ``source`` at ``out`` whose config names ``architecture``."""
    shutil.copytree(source, out, dirs_exist_ok=True)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = [architecture]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
