"""Process-group setup for ``torchrun``; a no-op in a single process.

``torchrun --nproc_per_node=N -m rltok train ...`` sets RANK/WORLD_SIZE/LOCAL_RANK; we use gloo on
CPU and NCCL on GPU. Only rank 0 writes logs and checkpoints. Shutdown follows the pattern that
avoids gloo's occasional abort at exit on CPU: barrier, destroy, flush, exit.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from .errors import RltokError


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return t
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise max across ranks, on the device (no host round trip)."""
        if not self.enabled:
            return t
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return t
        return self.all_reduce_sum(t) / self.world

    def any(self, flag: bool) -> bool:
        """True on every rank if any rank passes True."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


class StopVote:
    """Ranks agree to stop without a host sync in the training stream. Each step, every rank posts
    its flag (a signal arrived, the torchrun agent is gone) in an asynchronous all-reduce (max) on
    a CPU (gloo) group and reads the result it posted one step earlier: all ranks learn it at the
    same step boundary, at most one step after the last rank saw the signal, and stop together.
    One process: the flag itself, at once."""

    def __init__(self, info: DistInfo):
        self.group = dist.new_group(backend="gloo") if info.enabled else None
        self.pending: tuple[torch.Tensor, Any] | None = None

    def step(self, flag: bool) -> bool:
        if self.group is None:
            return flag
        agreed = False
        if self.pending is not None:
            t, work = self.pending
            work.wait()
            agreed = bool(t.item() > 0)
        t = torch.tensor([1.0 if flag else 0.0])
        self.pending = (t, dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True))
        return agreed

    def finish(self) -> bool:
        """Wait for the last posted vote (every rank posts the same number); its result."""
        agreed = False
        if self.pending is not None:
            t, work = self.pending
            work.wait()
            agreed = bool(t.item() > 0)
            self.pending = None
        return agreed


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RltokError("train.device=cuda but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_pref: str = "auto") -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_pref, local_rank)
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world=world, local_rank=local_rank, device=device)


def shutdown_and_exit(info: DistInfo, code: int) -> None:
    """End a torchrun worker cleanly (the gloo-safe order) and exit with ``code``."""
    if info.enabled and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
