"""Host-device synchronisation: the accelerator path on any device, and a counter of the ops
that would stall a GPU.

On a GPU every ``.item()``, ``.tolist()``, ``.numpy()``, data-dependent shape (``nonzero``,
boolean-mask indexing, ``masked_select``) or device-to-host copy waits for the device to drain
its queue. :class:`SyncCounter` records each such op with the rltok line that asked for it, on
any device, so a test on the CPU can hold the GPU step to its sync budget.

Some code takes a different branch on the CPU (the policy's sequential numpy scan, the explicit
attention kernel, packed main-network rows); :func:`accelerator_path` says which branch a
device takes, and :func:`force_accelerator_path` makes the CPU take the GPU's branches so the
counter sees what a GPU would run.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_FORCED = [False]


def accelerator_path(device: torch.device | str) -> bool:
    """Whether code on ``device`` takes the accelerator's branches (every non-CPU device; the CPU
    under :func:`force_accelerator_path` or ``RLTOK_ACCELERATOR_PATH=1``)."""
    dev = torch.device(device) if isinstance(device, str) else device
    return dev.type != "cpu" or _FORCED[0] or os.environ.get("RLTOK_ACCELERATOR_PATH") == "1"


@contextlib.contextmanager
def force_accelerator_path(enabled: bool = True) -> Iterator[None]:
    """Within the block the CPU takes the branches a GPU takes."""
    old, _FORCED[0] = _FORCED[0], enabled
    try:
        yield
    finally:
        _FORCED[0] = old


_aten = torch.ops.aten
# ops whose result the host must wait for (a value read, or an output shape that depends on
# data; nonzero_static has a fixed size and is not one)
SYNC_OPS = {
    _aten._local_scalar_dense.default: "item",  # .item(), int(t), bool(t), float(t)
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
}


@dataclass
class SyncEvent:
    kind: str  # item, nonzero, bool_index, masked_select, to_host, tolist, numpy, from_host
    where: str  # the innermost rltok frame: "rltok/model/chunking.py:50 chunk_indices"

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}"


def _where() -> str:
    """The innermost frame of rltok (or of the caller, outside torch) that led here."""
    first_outside = None
    torch_dir = os.path.dirname(torch.__file__).replace(os.sep, "/")
    for f in reversed(traceback.extract_stack()):
        path = f.filename.replace(os.sep, "/")
        if path.endswith("rltok/syncs.py") or path.startswith(torch_dir):
            continue
        if "/rltok/" in path:
            return f"rltok/{path.split('/rltok/', 1)[1]}:{f.lineno} {f.name}"
        if first_outside is None:
            first_outside = f"{os.path.basename(path)}:{f.lineno} {f.name}"
    return first_outside or "?"


class _HostData(TorchFunctionMode):
    """Tensors made from host (Python) data directly on the compute device: on a GPU each is a
    blocking host-to-device copy (``torch.tensor(0.99, device="cuda")``)."""

    def __init__(self, counter: "SyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None \
                and not (args and isinstance(args[0], torch.Tensor)) \
                and (torch.device(kwargs["device"]).type != "cpu" or accelerator_path("cpu")):
            self.counter._add("from_host")
        return func(*args, **kwargs)


class SyncCounter(TorchDispatchMode):
    """Records every op that would synchronise a GPU while the block runs (forward, backward and
    optimizer alike), with the rltok line that caused it::

        with SyncCounter() as sc:
            step(...)
        print(len(sc.events), *sc.events, sep="\\n")
    """

    def __init__(self):
        super().__init__()
        self.events: list[SyncEvent] = []
        self._patched: list[tuple[str, object]] = []
        self._host_data = _HostData(self)
        self._quiet = 0  # inside .tolist()/.numpy(): their own copy is that one sync

    def _add(self, kind: str) -> None:
        self.events.append(SyncEvent(kind, _where()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._quiet:
            return func(*args, **kwargs)
        kind = SYNC_OPS.get(func)
        if kind:
            self._add(kind)
        elif func is _aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())):
            self._add("bool_index")
        elif func in (_aten._to_copy.default, _aten.copy_.default):
            src = args[1] if func is _aten.copy_.default else args[0]
            dst = args[0].device if func is _aten.copy_.default else kwargs.get("device")
            if isinstance(src, torch.Tensor) and dst is not None and src.device.type != "cpu" \
                    and torch.device(dst).type == "cpu":
                self._add("to_host")
        return func(*args, **kwargs)

    def __enter__(self):
        # .tolist() and .numpy() read memory without dispatching an op: wrap them
        for name in ("tolist", "numpy"):
            orig = getattr(torch.Tensor, name)
            self._patched.append((name, orig))

            def wrapped(t, *a, _orig=orig, _name=name, **k):
                if not self._quiet:  # (a torch function mode calls it again from inside)
                    self._add(_name)
                self._quiet += 1
                try:
                    return _orig(t, *a, **k)
                finally:
                    self._quiet -= 1

            setattr(torch.Tensor, name, wrapped)
        self._host_data.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._patched:
            setattr(torch.Tensor, name, orig)
        self._patched.clear()
        out = super().__exit__(*exc)
        self._host_data.__exit__(*exc)
        return out

    def by_site(self) -> dict[str, int]:
        """{"kind at file:line function": count}, most frequent first."""
        out: dict[str, int] = {}
        for e in self.events:
            out[str(e)] = out.get(str(e), 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
