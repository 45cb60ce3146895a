"""What README.md, docs/*.md and benchmarks/README.md tell a reader to run or to open exists, as they say it: checked
against the code; and what they measure names its source.

The claims, read from the pages' text:

* **commands**, ``python -m X [--flag ...]``: module ``X`` exists (found on
  ``sys.path`` as a file, nothing imported), and every ``--flag`` a command
  of one of this project's modules uses appears in that module's ``--help``;
* **paths** that start in one of the project's top-level folders or files
  (``serve_app/engine/cluster_env.py``, ``docs/benchmarks/vs_vllm/``, a link
  ``[...](serve.md#anchor)``): they exist (outputs under ``out/`` and
  ``.cache/`` are made by the commands, and are not checked; upstream
  vLLM's own test paths, ``tests/v1/...`` in docs/upstream_tests.md, are
  another tree's: one of the runner's ``AREAS``, or in a folder of
  ``tests/`` this repository does not have);
* **names**, ``package.module.NAME`` of a project package: the module exists
  and defines ``NAME`` (a name it only imports is defined elsewhere: the page
  must name where);
* **links** ``[...](page.md#anchor)`` to a page of the project: the page has that heading;
* **figures and dates** (issue 46, below): a measured figure names its raw file or results-log entry in
  its paragraph, and a date appears only in such a link.

``docs/results_log.md`` is a dated log (its commands and paths are what they
were on the day) and is not read; generated pages under ``docs/benchmarks/``
and ``docs/load_tests/`` neither. The checks are shown to fail on a planted
false command, flag, path and name, and on a planted dated story, unsourced
figure and unsourced table.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "results_log.md"),
    REPO / "benchmarks" / "README.md",
]
PACKAGES = ("patches", "serve_app", "load_tests", "monitoring", "fixture_model", "testkit", "benchmarks", "tests")
TOP_FILES = ("serve_config.yaml", "serve_config.cuda.yaml", "pyproject.toml", "README.md")
TOP = (*PACKAGES, "docs", "scripts", *TOP_FILES)
GENERATED = ("out/", ".cache/")

COMMAND = re.compile(r"python\s+-m\s+([A-Za-z_][\w.]*)([^\n`#|)]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOTTED = re.compile(r"^(?:{})(?:\.\w+)+$".format("|".join(PACKAGES)))


def module_file(name: str, run: bool = True) -> Path | None:
    """Where ``python -m name`` would find its code (``run``), or where ``name``'s definitions are, looked up on
    sys.path (nothing imported)."""
    parts = name.split(".")
    for root in (REPO, *map(Path, filter(None, sys.path))):
        base = root.joinpath(*parts)
        package = (base / "__main__.py", base / "__init__.py") if run else (base / "__init__.py",)
        for candidate in (base.with_suffix(".py"), *package):
            if candidate.is_file():
                return candidate
    return None


def upstream_test_path(path: str) -> bool:
    """A path of upstream vLLM's own tests (docs/upstream_tests.md), not of this repository."""
    from testkit.upstream_vllm import AREAS

    parts = Path(path).parts
    return parts[0] == "tests" and (
        any(path.startswith(p) for area in AREAS.values() for p in area.paths)
        or (len(parts) > 2 and not (REPO / parts[0] / parts[1]).exists())
    )


@functools.cache
def help_flags(module: str) -> frozenset[str]:
    """The flags ``python -m module --help`` prints."""
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, f"python -m {module} --help failed: {r.stderr[-1000:]}"
    return frozenset(FLAG.findall(r.stdout))


def commands(text: str) -> list[tuple[str, list[str]]]:
    """Every ``python -m X`` of a page, with the flags it passes."""
    return [(m.group(1).rstrip("."), FLAG.findall(m.group(2))) for m in COMMAND.finditer(text)]


def command_problems(text: str) -> list[str]:
    problems = []
    for module, flags in commands(text):
        if module_file(module) is None:
            problems.append(f"python -m {module}: no such module")
        elif flags and module.split(".")[0] in PACKAGES:
            problems += [
                f"python -m {module} {flag}: not in its --help" for flag in flags if flag not in help_flags(module)
            ]
    return problems


def path_problems(text: str, page: Path) -> list[str]:
    problems = []
    for token in CODE.findall(text):
        word = token.strip().split()[0] if token.strip() else ""
        if word.startswith(TOP) and ("/" in word or word in TOP_FILES) and not word.startswith(GENERATED):
            path = word.split("#")[0].split(":")[0].rstrip(",.;")
            if "*" not in path and not (REPO / path).exists() and not upstream_test_path(path):
                problems.append(f"`{token}`: no {path}")
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        if path and not (page.parent / path).exists():
            problems.append(f"link ({target}): no {(page.parent / path).resolve().relative_to(REPO.resolve())}")
        elif anchor and (path.endswith(".md") or not path):
            linked = (page.parent / path) if path else page
            if linked.is_file() and anchor not in anchors(linked):
                problems.append(
                    f"link ({target}): no heading #{anchor} in {linked.resolve().relative_to(REPO.resolve())}"
                )
    return problems


def _defines(source: str, name: str) -> bool:
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def project_module(parts: list[str]) -> tuple[int, Path] | None:
    """The longest prefix of ``parts`` that is a module of this repository: (its length, its file); None if none."""
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]), run=False)
        if path is not None and path.is_relative_to(REPO):
            return cut, path
    return None


def name_problems(text: str) -> list[str]:
    """``package.module.NAME`` in code spans: the longest prefix that is a module, then NAME defined in it."""
    problems = []
    for token in CODE.findall(text):
        token = token.strip().rstrip("()")
        if not DOTTED.match(token):
            continue
        parts = token.split(".")
        found = project_module(parts)
        if found is None:
            problems.append(f"`{token}`: no such module")
            continue
        cut, path = found
        rest = parts[cut:]
        if rest and not _defines(path.read_text(), rest[0]):
            problems.append(f"`{token}`: {'.'.join(parts[:cut])} defines no {rest[0]}")
    return problems


def problems_of(page: Path, text: str | None = None) -> list[str]:
    text = page.read_text() if text is None else text
    return command_problems(text) + path_problems(text, page) + name_problems(text)


PLANTED = """
Run `python -m load_tests --scenario smoke --no-such-flag` or `python -m load_tests.nope`.
The table is in `serve_app/no_such_table.py`; see [the guide](no_such_page.md#top).
The kinds are `load_tests.plan.scenarios.LYING_CONNECTOR_KINDS`.
```bash
python -m benchmarks.vs_vllm --pairs 5 --warp-speed   # a made-up flag
```
"""


def test_the_checks_find_a_planted_false_command_flag_path_and_name():
    assert problems_of(REPO / "docs" / "planted.md", PLANTED) == [
        "python -m load_tests --no-such-flag: not in its --help",
        "python -m load_tests.nope: no such module",
        "python -m benchmarks.vs_vllm --warp-speed: not in its --help",
        "`serve_app/no_such_table.py`: no serve_app/no_such_table.py",
        "link (no_such_page.md#top): no docs/no_such_page.md",
        "`load_tests.plan.scenarios.LYING_CONNECTOR_KINDS`: load_tests.plan.scenarios defines no LYING_CONNECTOR_KINDS",
    ]


def test_true_claims_pass():
    text = (
        "`python -m load_tests --scenario smoke --url http://x`, `serve_app/engine/cluster_env.py`, "
        "[serve](serve.md#request-routing), `patches.definitions.metrics.LYING_CONNECTOR_KINDS`, "
        "`out/stress/report.md`, "
        "`python -m pytest tests/test_docs.py`"
    )
    assert problems_of(REPO / "docs" / "x.md", text) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_page_says_what_the_code_does(page):
    assert problems_of(page) == []


# A project module named in prose: ``load_tests.observe.scraper`` (a module, or a module and a name it defines) or
# ``load_tests/observe/scraper.py``. Files named by other suffixes (``docs/patches.md``) are paths, checked above.
MODULE_NAMED = re.compile(
    r"(?<![\w./-])((?:{})(?:\.[A-Za-z_]\w*)+)".format("|".join(p for p in PACKAGES if p != "tests"))
)
FILE_NAMED = re.compile(r"(?<![\w./-])((?:{})/[\w/]+\.py)\b".format("|".join(p for p in PACKAGES if p != "tests")))
NOT_MODULES = (".md", ".json", ".yaml", ".yml", ".py", ".sh", ".txt", ".png")


def dead_module_paths(text: str) -> list[str]:
    """Every project module ``text`` names (dotted or as a file) that does not exist, and every
    ``package.NAME`` whose package defines no such name or submodule."""
    problems = []
    for m in MODULE_NAMED.finditer(text):
        token = m.group(1).rstrip(".")
        if token.endswith(NOT_MODULES):
            continue
        parts = token.split(".")
        found = project_module(parts)
        if found is None:
            problems.append(f"{token}: no such module")
            continue
        cut, path = found
        if cut == 1 and len(parts) > 1 and not _defines(path.read_text(), parts[1]):
            problems.append(f"{token}: {parts[0]} has no module or name {parts[1]}")
    problems += [f"{m.group(1)}: no such file" for m in FILE_NAMED.finditer(text) if not (REPO / m.group(1)).exists()]
    return problems


def code_and_doc_files() -> list[Path]:
    """Every module of the project's packages (the tests' own plant false names on purpose) and every page read
    above, with pyproject.toml."""
    code = [p for pkg in PACKAGES if pkg != "tests" for p in sorted((REPO / pkg).rglob("*.py"))]
    return [*code, *PAGES, REPO / "pyproject.toml"]


def test_every_module_named_in_code_docstrings_and_docs_exists():
    problems = [f"{f.relative_to(REPO)}: {p}" for f in code_and_doc_files() for p in dead_module_paths(f.read_text())]
    assert problems == []


def test_the_module_check_finds_a_moved_module_in_a_docstring():
    planted = (
        '"""Counts are read by :mod:`load_tests.scraper` (now load_tests/observe/scraper.py), see load_tests/x.py."""'
    )
    assert dead_module_paths(planted) == [
        "load_tests.scraper: load_tests has no module or name scraper",
        "load_tests/x.py: no such file",
    ]
    assert dead_module_paths("load_tests.observe.scraper.scrape and `docs/patches.md` and patches.md") == []


# Reference pages describe the system as it is (issue 46): every dated measurement and story is in the results log
# (append-only), and every figure a page keeps names its source in its paragraph: a link to a results-log entry
# (``results_log.md#anchor``, the anchor one of the log's headings) or to a raw file or folder under
# docs/benchmarks/ or docs/load_tests/, relative to the page. A table's source may be the paragraph right before
# it. A date may appear only as part of such a link (its text or its target): anywhere else it is a dated story.
# Fenced code is not read; inline code is read for figures (a figure in backticks is a figure) but not for dates (a
# path or a command may carry one). README is also short: at most README_LINES lines, with the two commands.
README_LINES = 200
RESULTS_LOG = REPO / "docs" / "results_log.md"
RAW = tuple(REPO / "docs" / d for d in ("benchmarks", "load_tests", "monitoring"))
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\breq/s\b|\b\d+(?:\.\d+)? ?ms\b|\b\d+(?:\.\d+)? ?%")
MD_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)


def anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors of ``page``'s headings (lowercase, punctuation dropped, each space a '-', a repeat ``-1``) and
    its ``<a id="...">`` tags."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out | set(re.findall(r'<a\s+(?:id|name)="([^"]+)"', page.read_text())))


def is_source(target: str, page: Path) -> bool:
    """``target``, a link of ``page``, is a figure's source: an entry of the results log or a raw file under
    docs/benchmarks/ (or docs/load_tests/) that exists."""
    path, _, anchor = target.partition("#")
    if not path or target.startswith(("http://", "https://")):
        return False
    where = (page.parent / path).resolve()
    if where == RESULTS_LOG.resolve():
        return anchor in anchors(RESULTS_LOG)
    return where.exists() and any(where.is_relative_to(raw.resolve()) and where != raw.resolve() for raw in RAW)


def unsourced(text: str, page: Path) -> list[str]:
    """The paragraphs of ``text`` (the text of ``page``) with a date outside a source link, or a figure without a
    source in the paragraph (a table: or in the paragraph right before it); each as ``why: its first line``."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", FENCE.sub("", text)) if p.strip()]
    sourced = [any(is_source(m.group(2), page) for m in MD_LINK.finditer(p)) for p in paragraphs]
    problems = []
    for i, para in enumerate(paragraphs):
        first = para.splitlines()[0][:100]
        bare = CODE.sub("", MD_LINK.sub(lambda m: "" if is_source(m.group(2), page) else m.group(0), para))
        if DATE.search(bare):
            problems.append(f"dated: {first}")
        elif FIGURE.search(para) and not (sourced[i] or (para.startswith("|") and i and sourced[i - 1])):
            problems.append(f"figure without source: {first}")
    return problems


def test_readme_is_a_page_with_its_two_commands_and_no_unsourced_date_or_figure():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    assert "scripts/main.sh" in text and "scripts/test.sh" in text
    assert unsourced(text, REPO / "README.md") == []


LOG_ENTRY = "results_log.md#2026-11-27-0352-0411-utc--the-hostile-scenario-and-its-aa-control"


def test_the_check_finds_a_dated_story_an_unsourced_figure_and_an_unsourced_table():
    page = REPO / "docs" / "planted.md"
    story = (
        "A later check (2026-11-27, 2 blocks, below the protocol) found more ([raw](benchmarks/vs_vllm/vs_vllm.md))."
    )
    figure = "The shipped stack serves 1.5x the stock peer's requests."
    table = "Shipped / plain:\n\n| in flight | req/s |\n|---|---|\n| 8 | 1.22x |"
    in_code = "It serves `1.5x` the peer's rate."
    loose = (
        "It serves 1.5x ([the log](results_log.md), [no entry](results_log.md#no-such-entry), "
        "[code](../benchmarks/vs_vllm.py), [all raw](benchmarks/), [a page](benchmarks.md#x))."
    )
    assert unsourced("\n\n".join((story, figure, table, in_code, loose)), page) == [
        f"dated: {story[:100]}",
        f"figure without source: {figure}",
        "figure without source: | in flight | req/s |",
        f"figure without source: {in_code}",
        f"figure without source: {loose[:100]}",
    ]
    readme = "Shipped / plain: 1.04x ([raw](benchmarks/vs_vllm/vs_vllm.md))."
    assert unsourced(readme, REPO / "README.md") == [f"figure without source: {readme}"], "README's benchmarks/ is code"


def test_their_sourced_twins_pass():
    page = REPO / "docs" / "planted.md"
    story = f"The check found more ([results log 2026-11-27 03:52]({LOG_ENTRY}))."
    figure = "The shipped stack serves 1.04x plain's requests ([raw](benchmarks/vs_vllm/vs_vllm.md))."
    table = "Shipped / plain ([raw](benchmarks/vs_vllm/)):\n\n| in flight | req/s |\n|---|---|\n| 8 | 1.22x |"
    code = "```bash\nrun 2026-11-26  # 1.5x\n```\n\nIts files go to `out/2026-11-26/`."
    assert unsourced("\n\n".join((story, figure, table, code)), page) == []
    readme = f"Host: 2 cores, [run 2026-11-26](docs/benchmarks/vs_vllm/vs_vllm.md), 1.04x ([log](docs/{LOG_ENTRY}))."
    assert unsourced(readme, REPO / "README.md") == []
    bench = f"Each writes 1.04x ([raw](../docs/benchmarks/vs_vllm/vs_vllm.md); [2026-11-27](../docs/{LOG_ENTRY}))."
    assert unsourced(bench, REPO / "benchmarks" / "README.md") == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_reference_page_has_no_dated_story_and_no_figure_without_its_source(page):
    assert unsourced(page.read_text(), page) == []


# Issue 70: dates stay in the results log. A dated line anywhere else (a link to a results-log entry carries its date
# in the anchor) is counted: at most DATED_LINES over the reference pages together, README_DATED_LINES in README.
DATED_LINES = 15
README_DATED_LINES = 2


def dated_lines(text: str) -> int:
    """How many lines of ``text`` carry a date, link targets and fenced code included."""
    return sum(1 for line in text.splitlines() if DATE.search(line))


def test_dates_stay_in_the_results_log():
    pages = [p for p in (REPO / "docs").glob("*.md") if p != RESULTS_LOG]
    assert sum(dated_lines(p.read_text()) for p in pages) <= DATED_LINES, {
        p.name: n for p in pages if (n := dated_lines(p.read_text()))
    }
    assert dated_lines((REPO / "README.md").read_text()) <= README_DATED_LINES


def test_the_date_count_sees_a_date_in_a_link_and_in_prose():
    planted = "\n".join(
        [f"see [the log](results_log.md#2026-11-{d:02d}-0000-utc--x)" for d in range(1, 9)]
        + [f"On 2026-11-{d:02d} it ran." for d in range(1, 9)]
        + ["no date here", "`out/stress/` neither"]
    )
    assert dated_lines(planted) == 16 > DATED_LINES
