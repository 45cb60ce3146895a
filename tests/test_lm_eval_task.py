"""The fixture model's lm-eval task files (fixture_model.lm_eval_task): what lm-eval reads (pure, no lm-eval here;
docs/fuzz.md logs the run of lm-eval 0.4.13 against a patched server with them)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fixture_model import lm_eval_task
from fixture_model.tasks import held_out_examples, is_correct


def test_the_task_names_its_documents_and_scores_the_held_out_answers(tmp_path):
    path = lm_eval_task.write(tmp_path / "task", per_task=3)
    spec = yaml.safe_load(path.read_text())
    assert spec["task"] == "fixture_tasks" and spec["output_type"] == "generate_until"
    documents = spec["dataset_kwargs"]["data_files"]["test"]
    rows = [json.loads(line) for line in Path(documents).read_text().splitlines()]
    examples = held_out_examples(3)
    assert [(r["prompt"], r["answer"]) for r in rows] == [(e.prompt, e.answer) for e in examples]
    # what the model must generate up to lm-eval's stop (".") is the fixture's own notion of correct
    assert all(is_correct(e, f" {e.answer} .") for e in examples)
    assert spec["generation_kwargs"]["until"] == ["."] and spec["metric_list"][0]["metric"] == "exact_match"
