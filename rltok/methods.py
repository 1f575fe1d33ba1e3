"""The methods registry: every boundary method (and flat baseline) by name.

It imports each method's module, which registers a :class:`~rltok.boundaries.base.MethodSpec`
(config class, build function, presets). Nothing below it imports it: the configuration
(``rltok.schema``), the models and the methods know no registry, so no import cycle runs through
it; ``rltok.config`` (resolving presets and recipes), ``rltok.run`` and the commands use it.
"""

from __future__ import annotations

from .boundaries import base
# each module registers its method(s) on import
from .boundaries import bpe, bpe_lm, bytes_lm, fixed, hnet, nawrot, policy  # noqa: F401
from .boundaries.base import MethodSpec
from .errors import RltokError

# the order `rltok train --list-methods` shows: the paper's method, rules, learned baselines, flat models
ORDER = ("rl", "uniform", "stride", "whitespace", "nawrot", "hnet", "bpe", "bytes", "bpe-lm")


def get_method(name: str) -> MethodSpec:
    if name not in base._METHODS:
        raise RltokError(f"unknown method {name!r}; choose one of: {', '.join(sorted(base._METHODS))}")
    return base._METHODS[name]


def method_names() -> list[str]:
    known = [m for m in ORDER if m in base._METHODS]
    return known + [m for m in base._METHODS if m not in known]
