"""Build the fixture model: a tiny Llama checkpoint trained on the synthetic tasks.

    python -m fixture_model.build [--out DIR] [--force]

Prints the checkpoint directory. The build is deterministic (fixed seeds,
fixed step count, single-process CPU training) and cached: the directory name
carries a hash of this file and ``tasks.py``, so a change to either builds a
new checkpoint and an unchanged tree reuses the old one. The cache's
``fixture`` entry (``.cache/models/fixture``, a link) names the checkpoint of
the current tree: it is the path ``serve_config.yaml`` deploys
(``model_source``), so building the model is the deployer's step, not the
app's.

Shape constraints found on the CPU backend: head_dim must be 64 (the CPU
attention rejects 16) and the weights are float32.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("fixture_model.build")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_CACHE = REPO / ".cache" / "models"

ARCH: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    # Long enough for the multi-block shared prefixes that prefix-cache and
    # offload tests need (the CPU KV block is 128 tokens).
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# lr 1e-3, not 3e-3: at 3e-3 whether the copy task (an induction circuit) is
# learned at all depended on the CPU's float kernels. On an AVX2-only host the
# 3e-3 run never learned it (copy accuracy 0.0 after 1000 steps, loss ~1.6);
# at 1e-3 copy reached 1.0 by step 500 there with two different seeds.
TRAIN: dict[str, Any] = dict(
    steps=600, batch=64, packed_batch=4, seq_len=1024, packed_every=3, lr=1e-3, warmup=30, seed=0, n_examples=60_000
)
# The build fails rather than hand the tests a model that cannot do its tasks
# (fuzz is measured as the accuracy it destroys).
MIN_TASK_ACCURACY = 0.5

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("build.py", "tasks.py"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:12]


# Where the built models are kept (default: .cache/models/ of the project).
CACHE_ENV = "FUZZSERVE_MODEL_CACHE"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, DEFAULT_CACHE))


def default_model_dir() -> Path:
    return cache_dir() / f"fixture-llama-{_fingerprint()}"


def current_link() -> Path:
    """The cache's ``fixture`` link to the current tree's checkpoint (what serve_config.yaml's model_source names)."""
    return cache_dir() / "fixture"


def _point_current_link(checkpoint: Path) -> None:
    """Make :func:`current_link` name ``checkpoint`` (a relative link, replaced atomically)."""
    link = current_link()
    if link.is_symlink() and link.resolve() == checkpoint.resolve():
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(checkpoint, link.parent))
    os.replace(tmp, link)


def build_tokenizer():
    """A word-level fast tokenizer over the task vocabulary.

    Metaspace pre-tokenization (as in SentencePiece models) makes decoding put
    the spaces back, so vLLM's incremental detokenizer yields " 40 41 42".
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from .tasks import SPECIALS, WORDS

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in WORDS:
        vocab.setdefault("\u2581" + w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    # Every sequence starts with <s>, in training and when vLLM tokenizes a prompt.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=ARCH["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _short_batches(tokenizer, examples, batch, rng):
    """One example per row, padded: most of the training signal, cheaply."""
    import torch

    order = list(range(len(examples)))
    while True:
        rng.shuffle(order)
        for i in range(0, len(order) - batch + 1, batch):
            ids = [tokenizer.encode(examples[j].text) for j in order[i : i + batch]]
            width = max(map(len, ids))
            x = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
            for r, row in enumerate(ids):
                x[r, : len(row)] = torch.tensor(row)
            yield x


def _packed_batches(tokenizer, examples, batch, seq_len, rng):
    """Packed rows: <s> then whole examples back to back, cut at ``seq_len`` tokens.

    Packing trains the model to do a task after hundreds of tokens of earlier
    examples, so that prompts with long shared prefixes (prefix cache and KV
    offload tests) still get task-correct, context-dependent continuations.
    """
    import torch

    order = list(range(len(examples)))
    pos = len(order)
    while True:
        rows = []
        for _ in range(batch):
            words, n = [], 1
            while n < seq_len:
                if pos == len(order):
                    rng.shuffle(order)
                    pos = 0
                text = examples[order[pos]].text
                pos += 1
                words.append(text)
                n += len(text.split())
            rows.append(tokenizer.encode(" ".join(words))[:seq_len])
        yield torch.tensor(rows, dtype=torch.long)


def _batches(tokenizer, examples, rng):
    """Every ``packed_every``-th step a packed batch, else a short one."""
    short = _short_batches(tokenizer, examples, TRAIN["batch"], rng)
    packed = _packed_batches(tokenizer, examples, TRAIN["packed_batch"], TRAIN["seq_len"], rng)
    step = 0
    while True:
        yield next(packed) if step % TRAIN["packed_every"] == 0 else next(short)
        step += 1


def train(out_dir: Path) -> None:
    import torch
    from rich.console import Console
    from rich.progress import Progress
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from .tasks import held_out_examples, training_examples

    torch.manual_seed(TRAIN["seed"])
    rng = random.Random(TRAIN["seed"])
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # transformers' configs take extra keyword arguments (torch_dtype, rope_theta) at run time
        # (@strict(accept_kwargs=True)); the type of their dataclass __init__ has no **kwargs.
        torch_dtype="float32",  # type: ignore[call-arg]
        **ARCH,
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / TRAIN["warmup"]) * max(0.05, 1 - s / TRAIN["steps"]),
    )
    examples = training_examples(TRAIN["n_examples"], seed=TRAIN["seed"])
    batches = _batches(tokenizer, examples, rng)

    t0 = time.monotonic()
    model.train()
    # on stderr: stdout is the checkpoint's path alone (scripts/main.sh reads it)
    progress = Progress(console=Console(stderr=True), transient=True)
    task = progress.add_task("training fixture model", total=TRAIN["steps"])
    progress.start()
    try:
        for _step in range(TRAIN["steps"]):
            x = next(batches)
            labels = x.masked_fill(x == tokenizer.pad_token_id, -100)
            loss = model(input_ids=x, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            progress.update(task, advance=1, description=f"training fixture model (loss {loss.item():.3f})")
    finally:
        progress.stop()
    train_s = time.monotonic() - t0

    accuracy = evaluate_hf(model, tokenizer, held_out_examples(20))
    log.info("trained in %.1f s, final loss %.3f, held-out accuracy %s", train_s, loss.item(), accuracy)
    weak = {t: a for t, a in accuracy.items() if a < MIN_TASK_ACCURACY}
    if weak:
        raise RuntimeError(
            f"fixture model training failed: held-out accuracy {accuracy} is below "
            f"{MIN_TASK_ACCURACY} for {sorted(weak)}; TRAIN = {TRAIN}"
        )

    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    model.eval()
    hf_logging.disable_progress_bar()  # one shard, written in a blink: its bar is noise on the console
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "fixture_build.json").write_text(
        json.dumps(
            {
                "train_seconds": round(train_s, 1),
                "final_loss": loss.item(),
                "held_out_accuracy": accuracy,
                "arch": ARCH,
                "train": TRAIN,
            },
            indent=2,
        )
    )
    tmp.rename(out_dir)  # atomic: a half-written directory is never picked up


def evaluate_hf(model, tokenizer, examples) -> dict[str, float]:
    """Greedy accuracy per task with plain transformers (no vLLM)."""
    import torch

    from .tasks import is_correct

    model.eval()
    right: dict[str, list[bool]] = {}
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor([tokenizer.encode(ex.prompt)])
            out = model.generate(
                ids, max_new_tokens=len(ex.answer.split()) + 1, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            right.setdefault(ex.task, []).append(is_correct(ex, text))
    model.train()
    return {t: sum(v) / len(v) for t, v in right.items()}


def ensure_model(out: Path | None = None, force: bool = False) -> Path:
    """Return the checkpoint directory, building it first if needed; the default one also becomes
    :func:`current_link`'s."""
    default = out is None
    out = Path(out) if out else default_model_dir()
    if out.exists() and force:
        import shutil

        shutil.rmtree(out)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        log.info("building fixture model into %s", out)
        train(out)
    if default:
        _point_current_link(out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: cached by content hash)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the directory exists")
    args = ap.parse_args(argv)
    # its own progress at INFO, every library from WARNING up (as load_tests.command_logs does for the others)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fixture_model").setLevel(logging.INFO)
    path = ensure_model(args.out, args.force)
    print(path)


if __name__ == "__main__":
    main()
