"""The Prometheus rules file, written from the observability contract: ``python -m monitoring.rules`` regenerates it.

    python -m monitoring.rules            # writes monitoring/prometheus/fuzzserve-rules.yml
    python -m monitoring.rules --check    # exit 1 if the committed file is not what this module makes

The rules are :data:`serve_app.observability.contract.INVARIANTS` (each invariant's alert) and
:data:`serve_app.observability.contract.RECORD_GROUPS` (the recording rules), the same catalogue the load tests'
checks read;
tests/test_observability_contract.py holds every alert and its Python twin to the same verdict on planted series.
The file is YAML that pyyaml writes (multi-line expressions as literal blocks), with each rule's note as a comment
above it, for the operators who read the file rather than the catalogue.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from serve_app.observability.contract import INVARIANTS, RECORD_GROUPS, RULES_HEADER, rule_groups

from .files import RULES_FILE

WIDTH = 110


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks; the rest as pyyaml chooses."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any, indent: str) -> str:
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=WIDTH, allow_unicode=True)
    return "".join(indent + line if line.strip() else line for line in text.splitlines(keepends=True))


def _comment(text: str, indent: str) -> str:
    return "".join(f"{indent}# {line}".rstrip() + "\n" for line in text.splitlines())


def render() -> str:
    """The rules file's text."""
    notes = {r.name: r.note for _g, records in RECORD_GROUPS for r in records}
    notes |= {i.alert.name: i.alert.note for i in INVARIANTS}
    out = [_comment(RULES_HEADER, ""), "groups:\n"]
    for n, group in enumerate(rule_groups()):
        if n:
            out.append("\n")
        out.append(f"  - name: {group['name']}\n    rules:\n")
        for k, rule in enumerate(group["rules"]):
            name = rule.get("record") or rule["alert"]
            if k and "alert" in rule:
                out.append("\n")
            if notes.get(name):
                out.append(_comment(notes[name], "      "))
            out.append(_dump([rule], "      "))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.rules", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed rules file differs from the output")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if RULES_FILE.read_text() != text:
            print(f"{RULES_FILE} is not what `python -m monitoring.rules` makes: run it", file=sys.stderr)
            return 1
        return 0
    RULES_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
