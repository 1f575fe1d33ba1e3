"""The accelerator path on the CPU: static chunk shapes, the sync counter, and the training
step's sync budget (one host sync per optimizer step)."""

import pytest
import torch

from rltok.config import build_config
from rltok.methods import get_method
from rltok.model.chunking import chunk_indices
from rltok.model.layers import PackedRows
from rltok.model.static import ChunkCaps
from rltok.bench import count_step_syncs
from rltok.syncs import SyncCounter, accelerator_path, force_accelerator_path


def test_counter_sees_each_kind_of_sync():
    x = torch.arange(6)
    with SyncCounter() as sc:
        y = x * 2  # no sync
        int(y.max())
        bool((y > 3).any())
        y[y > 3]
        y.nonzero()
        y.tolist()
        y.numpy()
    kinds = [e.kind for e in sc.events]
    assert kinds == ["item", "item", "bool_index", "nonzero", "tolist", "numpy"]
    assert all("test_static_chunks.py" in e.where for e in sc.events)
    # a tensor made from host data on the compute device: a blocking copy on a GPU
    with SyncCounter() as sc:
        torch.tensor(0.99, device="cpu")  # the CPU path: no device to copy to
        with force_accelerator_path():
            torch.tensor(0.99, device="cpu")
            torch.tensor([1.0, 2.0])  # made on the host, for the host: fine
            torch.full((2,), 0.99, device="cpu")  # filled on the device: fine
    assert [e.kind for e in sc.events] == ["from_host"]
    assert torch.Tensor.tolist is not None and "wrapped" not in torch.Tensor.tolist.__name__  # unpatched


def test_accelerator_path_switch():
    assert not accelerator_path("cpu")
    with force_accelerator_path():
        assert accelerator_path(torch.device("cpu"))
    assert not accelerator_path("cpu")
    assert accelerator_path("meta")


def test_capped_chunk_indices_hand_worked():
    # the module docstring's example: chunks {0},{1,2,3},{4,5,6,7},{8,9}
    b = torch.tensor([[1, 0, 0, 1, 0, 0, 0, 1, 0, 1]])
    dyn = chunk_indices(b)
    capped = chunk_indices(b, cap=6)
    assert capped.positions.tolist() == [[0, 3, 7, 9, 9, 9]]
    assert capped.valid.tolist() == [[True] * 4 + [False] * 2]
    assert torch.equal(capped.up, dyn.up) and torch.equal(capped.down, dyn.down)
    assert not bool(capped.overflow) and dyn.overflow is None
    over = chunk_indices(b, cap=3)  # four chunks do not fit: flagged, indices stay in range
    assert bool(over.overflow)
    assert over.positions.tolist() == [[0, 3, 7]]
    assert int(over.up.max()) == 2 and int(over.down.max()) == 2


def test_static_packed_rows_equal_dynamic():
    g = torch.Generator().manual_seed(0)
    valid = torch.rand(3, 7, generator=g) < 0.6
    x = torch.randn(3, 7, 5, generator=g)
    dyn, st = PackedRows.of(valid, multiple=1), PackedRows.of(valid, size=int(valid.sum()) + 4)
    assert torch.equal(st.pack(x)[: int(valid.sum())], dyn.pack(x))
    assert torch.equal(st.pack(x)[int(valid.sum()):], torch.zeros(4, 5))
    assert torch.equal(st.unpack(st.pack(x)), dyn.unpack(dyn.pack(x)))


def test_caps_sizes_and_growth():
    caps = ChunkCaps.initial(0.2, 1.5, 1.15, 8)
    assert caps.sizes(4, 512) == (160, 512)  # 0.3 x 512 = 153.6 -> 160; 0.23 x 2048 = 471 -> 512
    fill = caps.fill(torch.tensor([100, 170, 90, 80]), 512)
    assert fill.tolist() == pytest.approx([1.0, 170 / 512, 440 / 2048])
    caps.grow(170 / 512, 440 / 2048)
    assert caps.sizes(4, 512)[0] >= 1.25 * 170 and caps.grown == 1


def _step_model(method, over, seed=0):
    cfg = build_config(method, "smoke", overrides={"train.dtype": "fp32", **over})
    torch.manual_seed(seed)
    return cfg, get_method(method).build(cfg, None).train()


@pytest.mark.parametrize("method", ["rl", "uniform", "nawrot", "hnet"])
def test_static_forward_equals_dynamic(method):
    """Same weights, ids and uniforms: static chunk shapes change the padding, not the values
    (caps with room: nawrot's and hnet's random-weight rates are far from the target)."""
    cfg, model = _step_model(method, {"model.chunk_cap_row": 5.0, "model.chunk_cap_total": 5.0})
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (4, cfg.model.seq_len), generator=g)
    noise = torch.rand(ids.shape, generator=g)
    outs, grads = [], []
    for mode in ("off", "on"):
        model.cfg.static_chunks = mode
        model.zero_grad()
        out = model(ids, noise=noise)
        (out.logits.float().logsumexp(-1).mean() + out.early_logits.mean()).backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert outs[0].chunk_fill is None and outs[1].chunk_fill is not None
    assert float(outs[1].chunk_fill[0]) == 0.0  # within the caps
    assert outs[1].chunks.max_chunks >= outs[0].chunks.max_chunks
    torch.testing.assert_close(outs[1].logits, outs[0].logits, rtol=1e-5, atol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)


def test_overflow_repeats_the_step_with_grown_caps(small_corpus_file):
    """Caps far too small: the first step overflows, is skipped on the device and repeated with
    larger caps; the parameters then equal those of a dynamic-shape step on the same batch."""
    from rltok.bench import Bench

    over = {"data.source": str(small_corpus_file), "train.dtype": "fp32", "train.seed": 3}
    params = []
    for mode, cap in (("off", 1.5), ("on", 0.05)):
        torch.manual_seed(0)
        b = Bench("rl", "smoke", {**over, "model.static_chunks": mode, "model.chunk_cap_row": cap,
                                  "model.chunk_cap_total": cap}, "cpu")
        out = b.step_fn(0, b.cfg.train.lr)
        assert float(out.skipped) == 0.0
        params.append([p.detach().clone() for p in b.model.parameters()])
        if mode == "on":
            assert b.model.chunk_caps.grown >= 1
    for a, c in zip(*params):
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["rl", "uniform"])
def test_one_sync_per_optimizer_step_on_the_accelerator_path(method, small_corpus_file):
    """The budget: one host sync per optimizer step (the chunk-cap flags), with gradient
    accumulation over two micro-batches. A new .item()/.tolist()/nonzero/bool index anywhere in
    the forward, the losses, the backward or the optimizer fails this test and names the line."""
    over = {"data.source": str(small_corpus_file), "train.micro_batch": 2}
    res = count_step_syncs(method, "smoke", over)
    assert res.syncs == 1, res.sites
    (site,) = res.sites
    assert site.startswith("tolist at rltok/train.py") and "__call__" in site
    dyn = count_step_syncs(method, "smoke", {**over, "model.static_chunks": "off"})
    # dynamic shapes: the longest chunk count and the packed rows, per micro-step
    assert dyn.syncs == 4, dyn.sites
