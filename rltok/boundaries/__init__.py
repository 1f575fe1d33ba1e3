"""Boundary methods, one module each; each registers its method (``rltok.registry.register``).

Adding a method: write a small module with a config dataclass (subclass of BoundaryConfig) and a
BoundaryModule subclass, call ``register(MethodSpec(...))``, and import the module in
``rltok/methods.py`` (the registry, which looks methods up).
"""

from __future__ import annotations

from ..registry import MethodSpec, register
from .base import BoundaryModule, BoundaryOutput, LossContext

__all__ = ["BoundaryModule", "BoundaryOutput", "LossContext", "MethodSpec", "register"]
