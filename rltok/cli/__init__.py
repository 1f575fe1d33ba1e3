"""The ``rltok`` command line: thin parsers that call library functions and print results.

Each subcommand lives in its own module with ``register(subparsers)``; errors a user can cause
are printed as one line (``error: ...``) with a non-zero exit status and no traceback.
"""

from __future__ import annotations

import argparse
import os
import importlib
import math
import sys

from ..errors import RltokError

# The boundary methods give the main network a different chunk count almost every step; oneDNN
# caches a kernel per shape (1024 by default), which held several GB in long CPU runs. 256 keeps
# memory bounded at no measurable speed cost. Set before torch is imported; a user's value wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")

# subcommand modules, in the order --help lists them
COMMANDS = ("train", "eval", "compare", "tasks", "analyze", "boundaries", "plot", "generate", "bench", "plan", "data")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="rltok",
        description="Learned tokenization end to end: a byte-level U-Net whose chunk boundaries "
                    "are learned with REINFORCE, every baseline in one harness.",
        epilog="Run `rltok COMMAND --help` for the options of a command.")
    p.add_argument("--version", action="version", version=f"rltok {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"{__name__}.{name}_cmd")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}_cmd":
                continue  # command not available in this build
            raise
        mod.register(sub)
    return p


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" only where it says something: not for None/False/empty defaults, and
    not when the help text already states its default."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "default" in h or action.default in (None, False, [], "", argparse.SUPPRESS):
            return h
        return super()._get_help_string(action)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except RltokError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rltok: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        # the environment (a missing folder, a full or read-only disk) refused a read or write
        # that no reader or writer above turned into a RltokError: still one line naming the file
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


def parse_size(text: str) -> int:
    """'6e6', '6M', '500k', '1.5G' -> bytes (decimal units)."""
    s = text.strip().lower().rstrip("b")
    mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(s[-1:], 1)
    if s[-1:] in "kmgt":
        s = s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 6e6, 6M, 500k)") from None
    if not math.isfinite(v) or v >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite size below 2**63")
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return int(v)


def _int_in(text: str, lo: int, hi: int | None = None) -> int:
    """An integer in [lo, hi) from the command line, or argparse's one-line error."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < lo or (hi is not None and v >= hi):
        raise argparse.ArgumentTypeError(f"{text!r} must be >= {lo}" if hi is None else f"{text!r} must be in [{lo}, 2**63)")
    return v


def positive_int(text: str) -> int:
    return _int_in(text, 1)


def nonneg_int(text: str) -> int:
    return _int_in(text, 0)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return v


def seed_arg(text: str) -> int:
    """A seed: an integer in [0, 2**63) (numpy's generators take no negative seeds)."""
    return _int_in(text, 0, 2 ** 63)


def device_arg(text: str) -> str:
    """A torch device that exists here: cpu, cuda, cuda:N."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index or 0) >= n:
            raise argparse.ArgumentTypeError(f"{text!r}: no such CUDA device here ({n} visible)")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are supported")
    return text


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="CPU threads for torch (0 = the cores available to this process, less those "
                        "busy with other work right now; OMP_NUM_THREADS also sets it). On a machine "
                        "shared with other jobs, 1 avoids the large slowdown of oversubscribed threads")


def apply_threads(args):
    """Set torch's thread count from ``--threads`` (0: rltok.threads.choose_threads)."""
    n = getattr(args, "threads", 0) or 0
    if n < 0 or n > 4096:
        raise RltokError(f"--threads {n} must be in [0, 4096]")
    from ..threads import set_threads

    return set_threads(n)
