"""Check a dashboard JSON against Grafana's own dashboard schema, as published in Grafana's Foundation SDK.

Grafana publishes its dashboard schema (CUE, in the Grafana repository) as
generated types: the ``grafana-foundation-sdk`` package (Grafana Labs; the
version pinned in pyproject.toml carries the Grafana 11.6 schema) has a class
per schema object, with typed attributes, and a decoder per panel plugin
(``timeseries``, ``stat``, ...) and per data-source query (``prometheus``).
What the package lacks is a validator: its ``from_json`` copies values
without checking them, and drops fields it does not know. No other
maintained validator is installable from the registries this project uses
(the JSON-schema rendering of the same types is published only on GitHub),
so this module adds the two checks the SDK leaves out, on top of its
decoders:

1. **nothing unknown, nothing lost**: decoding with the SDK and encoding
   again must give back every field of the input, unchanged (a misspelt or
   unknown key, or a value the schema cannot hold, is dropped or changed by
   the round trip);
2. **types**: every attribute of every decoded object matches the type the
   schema gives it (strings, integers, booleans, enums and literals, lists,
   nested objects), and every query decodes as a query of a known data
   source (the panel's or the query's ``datasource.type``).

``python -m testkit.monitoring.grafana_schema FILE...`` prints the problems and exits 1
if there are any.
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.cog.runtime import UnknownDataquery
from grafana_foundation_sdk.models.dashboard import Dashboard

SDK_MODELS = "grafana_foundation_sdk.models."


def schema_problems(data: Any) -> list[str]:
    """Every way ``data`` (a parsed dashboard JSON) departs from Grafana's dashboard schema; empty when none."""
    if not isinstance(data, dict):
        return [f"$: a dashboard is a JSON object, got {type(data).__name__}"]
    register_default_plugins()
    try:
        model = Dashboard.from_json(data)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        return [f"$: Grafana's schema cannot decode this dashboard: {type(e).__name__}: {e}"]
    problems: list[str] = []
    _round_trip(data, json.loads(json.dumps(model, cls=JSONEncoder)), "$", problems)
    _check_types(model, "$", problems)
    return problems


def _round_trip(given: Any, kept: Any, path: str, problems: list[str]) -> None:
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            problems.append(f"{path}: an object where the schema has {type(kept).__name__}")
            return
        for key, value in given.items():
            if key not in kept:
                problems.append(f"{path}.{key}: not a field of Grafana's schema here")
            else:
                _round_trip(value, kept[key], f"{path}.{key}", problems)
    elif isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            problems.append(f"{path}: a list of {len(given)} the schema does not keep as such")
            return
        for i, (g, k) in enumerate(zip(given, kept, strict=False)):
            _round_trip(g, k, f"{path}[{i}]", problems)
    elif given != kept or type(given) is not type(kept):
        problems.append(f"{path}: {given!r} does not survive Grafana's schema (becomes {kept!r})")


def _check_types(obj: Any, path: str, problems: list[str]) -> None:
    """Each attribute of an SDK model object against its declared type, recursively."""
    hints = typing.get_type_hints(type(obj))
    for attr, hint in hints.items():
        _check_value(getattr(obj, attr, None), hint, f"{path}.{attr}", problems)


def _check_value(value: Any, hint: Any, path: str, problems: list[str]) -> None:
    if isinstance(value, UnknownDataquery):
        problems.append(f"{path}: a query of no known data-source type (set the panel's or query's datasource type)")
        return
    if not _conforms(value, hint):
        problems.append(f"{path}: {value!r} is not a {_name(hint)}")
        return
    if type(value).__module__.startswith(SDK_MODELS):
        _check_types(value, path, problems)
    elif isinstance(value, list):
        item = _item_hint(hint, list)
        for i, v in enumerate(value):
            _check_value(v, item, f"{path}[{i}]", problems)
    elif isinstance(value, dict) and _item_hint(hint, dict) is not Any:
        for k, v in value.items():
            _check_value(v, _item_hint(hint, dict), f"{path}.{k}", problems)


def _conforms(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin in (list, dict):
        return isinstance(value, origin)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint) or value in {m.value for m in hint}
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is cogvariants.Dataquery or isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a typing construct the generated models do not use


def _item_hint(hint: Any, container: type) -> Any:
    """The element type of ``list[X]`` (X) or ``dict[K, V]`` (V) inside a possibly Optional hint."""
    for h in (hint, *typing.get_args(hint)):
        if typing.get_origin(h) is container:
            return typing.get_args(h)[-1]
    return Any


def _name(hint: Any) -> str:
    if typing.get_args(hint):
        return str(hint).replace("typing.", "").replace("grafana_foundation_sdk.models.", "")
    return getattr(hint, "__name__", str(hint))


def main(argv: list[str] | None = None) -> int:
    bad = 0
    for path in argv if argv is not None else sys.argv[1:]:
        problems = schema_problems(json.loads(Path(path).read_text()))
        for p in problems:
            print(f"{path}: {p}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
