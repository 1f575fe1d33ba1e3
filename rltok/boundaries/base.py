"""The interface every boundary method implements, under the names the methods use: the router
base class and its types live in the model (``rltok/model/router.py``), which imports nothing of
the methods; this module names them for the methods' side."""

from __future__ import annotations

from ..model.router import (BoundaryOutput, BoundaryStep, LossContext, Router, RouterState, assign_rows,
                            bernoulli_entropy, bernoulli_log_prob, map_states, select_rows, where_rows)

BoundaryModule = Router  # a boundary method's router

__all__ = ["BoundaryModule", "BoundaryOutput", "BoundaryStep", "LossContext", "Router", "RouterState",
           "assign_rows", "bernoulli_entropy", "bernoulli_log_prob", "map_states", "select_rows", "where_rows"]
