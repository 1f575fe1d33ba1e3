"""Boundary methods. Each module registers one method with :func:`register`.

Adding a method: write a small module with a config dataclass (subclass of BoundaryConfig) and a
BoundaryModule subclass, call ``register(MethodSpec(...))`` and list the module below.
"""

from __future__ import annotations

import importlib

from .base import (BoundaryModule, BoundaryOutput, LossContext, MethodSpec, get_method,
                   method_names, register)

_MODULES = ("policy", "fixed", "nawrot", "hnet", "bpe", "bytes_lm", "bpe_lm")
_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")


__all__ = ["BoundaryModule", "BoundaryOutput", "LossContext", "MethodSpec", "get_method",
           "method_names", "register"]
