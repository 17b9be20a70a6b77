"""Strict YAML reading that remembers where each value came from.

PyYAML's defaults hide mistakes: a duplicate key silently keeps the last value and `no`/`on`/`yes` become
booleans. This loader refuses duplicate keys, only reads `true`/`false` as booleans, and records the line of
every mapping key so validation errors can say `file:line: field: message`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from groundwork.errors import ConfigError

Loc = tuple[str | int, ...]
MAX_VALUES = 10_000  # values in one settings file, aliases expanded: a real one has dozens
MAX_BYTES = 1 << 20  # a settings file larger than 1 MiB is not one


class _Budget:
    """Counts the values a document expands to: aliases of aliases grow exponentially (a "YAML bomb")."""

    def __init__(self, where: str) -> None:
        self.left, self.where = MAX_VALUES, where

    def spend(self, node: yaml.Node) -> None:
        self.left -= 1
        if self.left < 0:
            raise ConfigError(f"{self.where}:{node.start_mark.line + 1}: more than {MAX_VALUES} values once its"
                              " aliases are expanded: write the settings out without nested aliases (&name/*name)")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans (only true/false) and no duplicate keys."""


# Drop the YAML 1.1 bool resolver (yes/no/on/off) and add back only true/false.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _to_python(node: yaml.Node, loader: _StrictLoader, loc: Loc, lines: dict[Loc, int], where: str,
               budget: _Budget) -> Any:
    budget.spend(node)
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool) and key is not None:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: a {type(key).__name__} as a key: keys are plain names")
            if key in out:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"{where}:{line}: duplicate key {key!r}: each key may appear once")
            out[key] = _to_python(value_node, loader, (*loc, key), lines, where, budget)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, loader, (*loc, i), lines, where, budget) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


class SourcedDoc:
    """A parsed YAML document plus the line of every value, keyed by its path."""

    def __init__(self, data: Any, lines: dict[Loc, int], where: str) -> None:
        self.data = data
        self.lines = lines
        self.where = where

    def line_of(self, loc: Loc) -> int | None:
        """Line of the deepest known ancestor of `loc` (a missing field points at its parent)."""
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in self.lines:
                return self.lines[loc[:cut]]
        return None


def parse_yaml_text(text: str, where: str) -> SourcedDoc:
    loader = None
    try:
        loader = _StrictLoader(text)  # (its reader refuses control characters: a YAMLError too)
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}{line}: not valid YAML: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise ConfigError(f"{where}: the file is empty: expected a mapping of settings")
    lines: dict[Loc, int] = {}
    return SourcedDoc(_to_python(root, _StrictLoader(""), (), lines, where, _Budget(where)), lines, where)


def parse_value(text: str, where: str) -> Any:
    """One value typed as YAML reads it (`3` an int, `1e-3` a float, `[1, 2]` a list, `yes` a string)."""
    try:
        return yaml.load(text, Loader=_StrictLoader) if text.strip() else ""  # a SafeLoader: no objects built
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: {text!r} is not a YAML value: {problem}") from None


def read_yaml(path: str | Path) -> SourcedDoc:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file: pass the path of an existing YAML file")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file: pass the path of a YAML file")
    if path.stat().st_size > MAX_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size} bytes is not a settings file (over {MAX_BYTES}):"
                          " pass a YAML file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {raw[exc.start]:#04x} at offset {exc.start} is not"
                          " UTF-8): pass a YAML file") from None
    return parse_yaml_text(text, str(path))


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validation_message(exc: ValidationError, doc: SourcedDoc | None, where: str) -> str:
    """The first pydantic error as one line: `file:line: field: message`."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    line = doc.line_of(loc) if doc else None
    prefix = f"{where}:{line}" if line else where
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key: remove it or check its spelling"
    elif err["type"] == "finite_number":
        msg = "must be a finite number, not nan or inf"
    elif err["type"] == "missing":
        msg = "required field is missing: add it"
    more = len(exc.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{prefix}: {format_loc(loc)}: {msg}{tail}"


def validate_doc(model: type[BaseModel], doc: SourcedDoc) -> Any:
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{doc.where}: expected a mapping of settings at the top level")
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, doc, doc.where)) from None
