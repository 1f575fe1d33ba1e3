"""Data parallelism around the (pure) model: DDP by default; FSDP2 for larger models."""

from __future__ import annotations

import torch
from torch import nn

from .config import RunConfig
from .distributed import DistInfo


def wrap_data_parallel(model: nn.Module, cfg: RunConfig, info: DistInfo) -> nn.Module:
    """The module to call in the training step. The bare ``model`` keeps its attributes."""
    if cfg.train.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for blk in [*getattr(model, "encoder", []), *getattr(model, "main", []), *getattr(model, "decoder", [])]:
            fully_shard(blk)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights on CPU, for checkpoints and the final model file."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        DTensor = ()
    out = {}
    for k, v in model.state_dict().items():
        if DTensor and isinstance(v, DTensor):
            v = v.full_tensor()
        out[k] = v.detach().cpu()
    return out
