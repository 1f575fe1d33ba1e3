"""Every method by name: the boundary methods (rltok/boundaries/) and the flat baselines
(rltok/flat/).

It imports each method's module, which registers a :class:`~rltok.registry.MethodSpec` (config
classes, build function, presets) in ``rltok.registry``'s table. Nothing below it imports it: the
configuration (``rltok.schema``), the models and the methods know only the table, so no import
cycle runs through it; ``rltok.config`` (resolving presets and recipes), ``rltok.run`` and the
commands use it.
"""

from __future__ import annotations

from . import registry
# each module registers its method(s) on import
from .boundaries import bpe, entropy, fixed, hnet, nawrot, policy  # noqa: F401
from .errors import RltokError
from .flat import bytes_lm, token_lm  # noqa: F401
from .registry import MethodSpec

# the order `rltok train --list-methods` shows: the paper's method, rules, learned baselines, flat models
ORDER = ("rl", "uniform", "stride", "whitespace", "entropy", "nawrot", "hnet", "bpe", "bytes", "bpe-lm")


def get_method(name: str) -> MethodSpec:
    if name not in registry._METHODS:
        raise RltokError(f"unknown method {name!r}; choose one of: {', '.join(sorted(registry._METHODS))}")
    return registry._METHODS[name]


def method_names() -> list[str]:
    known = [m for m in ORDER if m in registry._METHODS]
    return known + [m for m in registry._METHODS if m not in known]
