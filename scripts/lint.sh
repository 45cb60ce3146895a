#!/usr/bin/env bash
# The lint: ruff's formatter check, ruff's lint rules and mypy over the paths listed below (their settings:
# [tool.ruff] and [tool.mypy] in pyproject.toml). scripts/test.sh runs it before the tests; alone:
# `scripts/lint.sh`. Exits non-zero on the first step that finds something; `ruff format <path>` (with the venv
# on PATH: `source scripts/env.sh`) rewrites what the format check flags.
set -euo pipefail
source "$(dirname "$0")/env.sh"
# What is formatted and linted: every Python folder of the project, the tests' own code included. What is
# type-checked: the same folders, every one.
LINT_PATHS=(serve_app patches monitoring fixture_model load_tests benchmarks testkit tests)
TYPED_PATHS=("${LINT_PATHS[@]}")
ruff format --check "${LINT_PATHS[@]}"
ruff check "${LINT_PATHS[@]}"
mypy "${TYPED_PATHS[@]}"
