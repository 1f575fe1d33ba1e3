"""Boundary methods, one module each; each registers its method (``base.register``).

Adding a method: write a small module with a config dataclass (subclass of BoundaryConfig) and a
BoundaryModule subclass, call ``register(MethodSpec(...))``, and import the module in
``rltok/methods.py`` (the registry, which looks methods up).
"""

from __future__ import annotations

from .base import BoundaryModule, BoundaryOutput, LossContext, MethodSpec, register

__all__ = ["BoundaryModule", "BoundaryOutput", "LossContext", "MethodSpec", "register"]
