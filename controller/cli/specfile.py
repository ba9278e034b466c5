"""Reading bag specs from files: JSON, or YAML with the YAML 1.2 core schema.

PyYAML implements YAML 1.1, where `1e-3` is a string and `NO`, `on`, `yes` are
booleans: a sweep over learning rates or country codes would silently change.
The loader here keeps YAML 1.1's syntax but resolves plain scalars the way YAML
1.2 (and JSON) do: booleans are only true/false, floats include 1e-3, and dates
and other non-JSON values are refused with the path to them.

Aliases are bounded: a 500-byte file whose anchors nest nine deep ("billion
laughs") stands for gigabytes, which checking and sending it would expand for
minutes. The document's node graph (each anchored node once, however many aliases
name it) says how large its JSON would be; past the largest body the API takes
(MAX_EXPANDED_BYTES) the file is refused before anything is expanded, and so is an
alias inside its own anchor (a document that contains itself).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from controller.config import DEFAULT_MAX_BODY_MB
from controller.errors import SpotbagError

# What a YAML document may expand to, in bytes of JSON: the largest request body the
# daemon takes by default ([api] max_body_mb); a larger bag would be refused anyway.
MAX_EXPANDED_BYTES = int(DEFAULT_MAX_BODY_MB * 1024 * 1024)


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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _own_size(node: yaml.Node, sizes: dict[int, int], limit: int) -> int:
    """About the bytes of JSON `node` makes (quotes, commas, brackets), its children's
    sizes known; at most limit + 1, so that the numbers stay small."""
    if isinstance(node, yaml.ScalarNode):
        size = len(node.value) + 2
    elif isinstance(node, yaml.SequenceNode):
        size = 2 + sum(sizes[id(child)] + 1 for child in node.value)
    else:
        size = 2 + sum(sizes[id(k)] + sizes[id(v)] + 2 for k, v in node.value)
    return min(size, limit + 1)


def expanded_size(root: yaml.Node, name: str, limit: int = MAX_EXPANDED_BYTES) -> int:
    """About how many bytes of JSON the composed document `root` makes once its aliases
    are expanded (at most limit + 1), in one pass over its node graph: an aliased node
    is counted once and its size reused. Raises SpecFileError for a recursive alias."""
    sizes: dict[int, int] = {}
    path: set[int] = set()  # the nodes being sized: an alias to one of them is recursive
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, sized_children = stack.pop()
        key = id(node)
        if sized_children:
            path.discard(key)
            sizes[key] = _own_size(node, sizes, limit)
            continue
        if key in sizes:
            continue
        if key in path:
            mark = node.start_mark
            raise SpecFileError(
                f"{name}: line {mark.line + 1}, column {mark.column + 1}: an alias is used "
                "inside its own anchor (the document would contain itself)"
            )
        path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)))
    return sizes[id(root)]


def _load_yaml(text: str, name: str) -> Any:
    """yaml.load with _Yaml12Loader, its aliases bounded: composed, sized, and only
    then constructed."""
    loader = _Yaml12Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if expanded_size(root, name) > MAX_EXPANDED_BYTES:
            raise SpecFileError(
                f"{name}: its YAML aliases (*name) would expand it to more than "
                f"{DEFAULT_MAX_BODY_MB:g} MB of JSON, larger than any bag the API takes "
                "(refused before expanding it)"
            )
        return loader.construct_document(root)
    finally:
        loader.dispose()


def load_spec_text(text: str, name: str) -> Any:
    is_json = name.endswith(".json")
    try:
        data = json.loads(text) if is_json else _load_yaml(text, name)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecFileError(f"{name} is not valid {'JSON' if is_json else 'YAML'}: {exc}") from None
    except RecursionError:
        raise SpecFileError(f"{name} is nested too deeply") from None
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
