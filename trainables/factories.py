"""A user's own code by import path: `package.module:name` for a model factory, a dataset factory or a loss.

A factory is called with the keyword arguments it declares, by name: what the run offers (`meta`: the data's
DataMeta, `cfg`: the TrainConfig, `num_classes`: from the meta) and the user's own settings (the launch's
`user:` mapping, `--set key=value`), which win. A factory with `**kwargs` also gets every user setting it does
not name. So `torchvision.models:resnet18` works as it is (`--set num_classes=10`), and so does
`def build(meta, cfg, hidden=64)`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from groundwork.errors import ConfigError

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def is_import_path(name: str) -> bool:
    return bool(IMPORT_PATH.match(name))


def resolve(path: str, what: str) -> Callable[..., Any]:
    """The callable at `package.module:name`; a ConfigError naming `what` (e.g. "model") if it is not one."""
    module, _, attr = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} {path!r} cannot be loaded ({exc}): check the module is importable from"
                          " this folder or PYTHONPATH") from None
    if not callable(found):
        raise ConfigError(f"{what} {path!r} is a {type(found).__name__}, not a function or class")
    return found


def call(factory: Callable[..., Any], path: str, what: str, offered: Mapping[str, Any],
         user: Mapping[str, Any]) -> Any:
    """`factory(**kwargs)` with the arguments it declares, from `user` first, then `offered`."""
    kwargs = factory_kwargs(factory, path, what, offered, user)
    return factory(**kwargs)


def factory_kwargs(factory: Callable[..., Any], path: str, what: str, offered: Mapping[str, Any],
                   user: Mapping[str, Any]) -> dict[str, Any]:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: it gets the user's settings only
        return dict(user)
    kwargs: dict[str, Any] = {}
    for name, param in params.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update({k: v for k, v in user.items() if k not in kwargs})
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        elif name in user or name in offered:
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise ConfigError(f"{what} {path!r}: argument {name!r} is positional-only: make it a keyword")
            kwargs[name] = user[name] if name in user else offered[name]
        elif param.default is inspect.Parameter.empty:
            raise ConfigError(f"{what} {path!r} needs argument {name!r}: set it with --set {name}=VALUE (or"
                              f" `user: {{{name}: ...}}` in the launch YAML); the run offers {sorted(offered)}")
    return kwargs
