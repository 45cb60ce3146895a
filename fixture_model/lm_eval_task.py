"""The fixture model's held-out tasks as an lm-eval task, so EleutherAI's harness can score fuzz through the API.

    python -m fixture_model.lm_eval_task DIR [--per-task N]

Writes ``DIR/fixture_tasks.yaml`` (a ``generate_until`` task: the prompt, the
expected continuation up to the task's ".", exact match) and
``DIR/fixture_tasks.jsonl`` (its documents: the same held-out examples the
fuzz sweep scores). Then, against a deployment (docs/fuzz.md has the
command): ``lm-eval run --model local-completions ... --include_path DIR
--tasks fixture_tasks --gen_kwargs '{"vllm_xargs": {...}}'``. lm-eval is
not one of the project's dependencies (it pins its own); install it in an
environment of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .tasks import held_out_examples

TASK = "fixture_tasks"


def task_yaml(documents: Path) -> str:
    """The task's YAML: lm-eval reads the documents as a local JSON dataset (no hub)."""
    return "\n".join(
        [
            f"task: {TASK}",
            "dataset_path: json",
            "dataset_kwargs:",
            "  data_files:",
            f"    test: {json.dumps(str(documents.resolve()))}",
            "test_split: test",
            "output_type: generate_until",
            'doc_to_text: "{{prompt}}"',
            'doc_to_target: "{{answer}}"',
            "generation_kwargs:",
            '  until: ["."]',
            "  max_gen_toks: 12",
            "  temperature: 0",
            "metric_list:",
            "  - metric: exact_match",
            "    aggregation: mean",
            "    higher_is_better: true",
            '    regexes_to_ignore: ["^\\\\s+", "\\\\s+$"]',
            "",
        ]
    )


def write(out: Path, per_task: int = 20) -> Path:
    """Write the task and its documents into ``out``; returns the YAML's path."""
    out.mkdir(parents=True, exist_ok=True)
    documents = out / f"{TASK}.jsonl"
    documents.write_text(
        "".join(
            json.dumps({"prompt": e.prompt, "answer": e.answer, "task": e.task}) + "\n"
            for e in held_out_examples(per_task)
        )
    )
    yaml = out / f"{TASK}.yaml"
    yaml.write_text(task_yaml(documents))
    return yaml


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fixture_model.lm_eval_task", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the folder to write the task into (lm-eval's --include_path)")
    ap.add_argument("--per-task", type=int, default=20, help="held-out examples per fixture task")
    args = ap.parse_args(argv)
    print(write(args.out, args.per_task))
    return 0


if __name__ == "__main__":
    sys.exit(main())
