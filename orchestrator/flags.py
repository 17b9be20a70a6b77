"""CLI flags made from the config models' own fields, so a setting is declared once: in the model, with its
type, bounds and help. Only flags the user gave override the defaults or a --config file."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _base_type(annotation: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """(python type, choices) of a field, looking through `X | None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    return annotation, None


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], prefix: str = "",
                    skip: tuple[str, ...] = ()) -> None:
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        _add_flag(parser, f"{prefix}{name}", name, field)


def _add_flag(parser: argparse.ArgumentParser, dest: str, name: str, field: FieldInfo) -> None:
    flag = "--" + name.replace("_", "-")
    kind, choices = _base_type(field.annotation)
    if (field.json_schema_extra or {}).get("flag_type") == "str":  # text the model parses itself
        kind = str
    help_text = (field.description or "") + (f" (default: {field.default})" if field.default is not None else "")
    if kind is bool:
        parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                            default=argparse.SUPPRESS, help=help_text)
    else:
        parser.add_argument(flag, dest=dest, type=kind, choices=choices, default=argparse.SUPPRESS,
                            metavar=None if choices else name.upper(), help=help_text)


def overrides_from(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """The given flags as a nested dict: `train.lr` -> {"train": {"lr": ...}}."""
    out: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith(prefix):
            continue
        key = dest[len(prefix):]
        if "." in key:
            group, sub = key.split(".", 1)
            out.setdefault(group, {})[sub] = value
        else:
            out[key] = value
    return out
