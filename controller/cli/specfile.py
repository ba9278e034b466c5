"""Reading bag specs from files: JSON, or YAML with the YAML 1.2 core schema.

PyYAML implements YAML 1.1, where `1e-3` is a string and `NO`, `on`, `yes` are
booleans: a sweep over learning rates or country codes would silently change.
The loader here keeps YAML 1.1's syntax but resolves plain scalars the way YAML
1.2 (and JSON) do: booleans are only true/false, floats include 1e-3, and dates
and other non-JSON values are refused with the path to them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from controller.errors import SpotbagError


class SpecFileError(SpotbagError, ValueError):
    exit_code = 2
    pass


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars."""


_Yaml12Loader.yaml_implicit_resolvers = {}
_CORE_RESOLVERS = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
]
for tag, pattern, first in _CORE_RESOLVERS:
    _Yaml12Loader.add_implicit_resolver(tag, re.compile(pattern), list(first))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 0) if text.startswith("0x") else int(text)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _json_problem(value: Any, path: str = "") -> str | None:
    """The path of the first value JSON cannot hold (dates, sets, NaN...), else None."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{where or '(top)'}: {item} is not a JSON number"
        elif not isinstance(item, str | int | float | bool | type(None)):
            return f"{where or '(top)'}: {item!r} is a {type(item).__name__}; quote it to make it a string"
    return None


def load_spec_text(text: str, name: str) -> Any:
    is_json = name.endswith(".json")
    try:
        data = json.loads(text) if is_json else yaml.load(text, Loader=_Yaml12Loader)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecFileError(f"{name} is not valid {'JSON' if is_json else 'YAML'}: {exc}") from None
    problem = _json_problem(data)
    if problem is not None:
        raise SpecFileError(f"{name}: {problem}")
    return data


def load_spec_file(path: str, stdin_text: str | None = None) -> Any:
    """A bag spec from a YAML or JSON file ('-': the given standard input)."""
    if path == "-":
        return load_spec_text(stdin_text or "", "<stdin>")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecFileError(f"{path} does not exist") from None
    except UnicodeDecodeError:
        raise SpecFileError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise SpecFileError(f"cannot read {path}: {exc.strerror}") from None
    return load_spec_text(text, path)
