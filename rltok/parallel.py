"""Data parallelism around the (pure) model, on PyTorch's own engine: DDP by default, FSDP2
(``fully_shard``) for larger models; plus the pieces the loop needs to treat both alike
(gradient-sync control for accumulation, full state dicts for checkpoints at any world size) and
per-block ``torch.compile``.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from .schema import RunConfig
from .distributed import DistInfo
from .checkpoint import load_optimizer_state, optimizer_state
from .model.layers import Block


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Every Transformer block, at every level of the U-Net (and a flat model's)."""
    return [m for m in model.modules() if isinstance(m, Block)]


def wrap_data_parallel(model: nn.Module, cfg: RunConfig, info: DistInfo) -> nn.Module:
    """The module to call in the training step. The bare ``model`` keeps its attributes.

    FSDP2 shards each Transformer block and then the rest; parameters become DTensors in place,
    so the optimizer must be created after this call. On CUDA with bf16 the gathered parameters
    are bf16 and gradients are reduced in fp32.
    """
    if cfg.train.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kw: dict[str, Any] = {}
        if info.device.type == "cuda" and cfg.train.dtype == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in _blocks(model):
            fully_shard(blk, **kw)
        fully_shard(model, **kw)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


@contextmanager
def grad_sync(fwd: nn.Module, model: nn.Module, enabled: bool, info: DistInfo):
    """Inside: backward passes reduce gradients across ranks only if ``enabled`` (the last
    accumulation micro-step). DDP: ``no_sync``; FSDP2: ``set_requires_gradient_sync``."""
    if not info.enabled or enabled and not hasattr(model, "set_requires_gradient_sync"):
        yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    ctx = fwd.no_sync() if hasattr(fwd, "no_sync") else nullcontext()
    with ctx:
        yield


def compile_blocks(model: nn.Module) -> None:
    """``torch.compile`` each Transformer block in place (before wrapping). The blocks have no
    data-dependent control flow, so they compile without graph breaks; the chunk count (the
    main network's length) varies, and ``model.chunk_pad_multiple`` keeps it to a few sizes."""
    for blk in _blocks(model):
        blk.compile()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) weights on CPU, for checkpoints and the final model file. With FSDP this
    is collective: call it on every rank."""
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


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, sharded: bool):
    """(tensors, meta) in the checkpoint's format (parameters numbered in ``named_parameters``
    order, full tensors), whatever the parallelism. Collective when ``sharded``; the result is
    only complete on rank 0 then."""
    if not sharded:
        return optimizer_state(opt)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not osd:
        return {}, {}
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    tensors, scalars = {}, {}
    for name, st in osd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{index[name]}.{k}"] = v
            else:
                scalars.setdefault(str(index[name]), {})[k] = v
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                              meta: dict[str, Any], sharded: bool) -> None:
    """Load a checkpoint's full optimizer state (any world size) into ``opt``; with FSDP each
    rank keeps its shard."""
    if not sharded:
        load_optimizer_state(opt, tensors, meta)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, _ in model.named_parameters()]
    state: dict[str, dict[str, Any]] = {}
    for key, v in tensors.items():
        _, pid, k = key.split(".", 2)
        state.setdefault(names[int(pid)], {})[k] = v
    for pid, kv in meta.get("scalars", {}).items():
        state.setdefault(names[int(pid)], {}).update(kv)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in meta["param_groups"]]
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))
