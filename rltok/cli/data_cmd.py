"""rltok data: data subcommands, each registered by a small function in its own module."""

from __future__ import annotations

import importlib

# modules with ``register_cli(subparsers)``, one per ``rltok data`` subcommand
SUBCOMMANDS = (
    "rltok.tasks.fetch",  # fetch-evals
)


def register(sub) -> None:
    p = sub.add_parser("data", help="obtain and prepare data (fetch-evals, ...)",
                       description="Data subcommands.")
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register_cli(dsub)
    p.set_defaults(func=lambda args: p.print_help() or 0)
