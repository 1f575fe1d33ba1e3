"""The whole training loss (router, chunking, main network, dechunking, losses) as one graph:
torch.compile(fullgraph=True) on the accelerator path (static chunk shapes), with no graph
break, and the compiled loss and gradients equal to eager."""

import pytest
import torch

from rltok.bench import Bench
from rltok.objectives import training_loss
from rltok.syncs import force_accelerator_path


def _bench(method, corpus, preset="smoke", **extra):
    over = {"data.source": str(corpus), "model.static_chunks": "on", "train.dtype": "fp32", "data.val_docs": 4, **extra}
    torch.manual_seed(0)
    with force_accelerator_path():
        b = Bench(method, preset, over, "cpu")
    batch = b.step_fn.dataset.batch(b.step_fn.indices(0)[: b.step_fn.layout.micro])
    return b.model, b.cfg, batch


@pytest.mark.parametrize("method,extra", [("rl", {"boundary.window": 1}), ("rl", {"boundary.window": 8}),
                                          ("uniform", {})])
def test_training_loss_has_no_graph_break(method, extra, small_corpus_file):
    """At the tiny preset's shapes; rl with w = 8 is the paper's policy (the parallel scan),
    w = 1 the fast one."""
    model, cfg, batch = _bench(method, small_corpus_file, preset="tiny", **{"data.source": str(small_corpus_file),
                                                                           "train.micro_batch": 4, **extra})

    def loss_fn(batch):
        return training_loss(model, batch, cfg).loss

    with force_accelerator_path():
        ex = torch._dynamo.explain(loss_fn)(batch)
    torch._dynamo.reset()
    assert ex.graph_break_count == 0, [str(r.reason) for r in ex.break_reasons]
    assert ex.graph_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rl", "uniform"])
def test_compiled_loss_and_gradients_equal_eager(method, small_corpus_file):
    model, cfg, batch = _bench(method, small_corpus_file)

    def loss_and_grads(fn):
        model.zero_grad(set_to_none=True)
        with force_accelerator_path():
            loss = fn(batch)
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    def loss_fn(batch):
        return training_loss(model, batch, cfg).loss

    le, ge = loss_and_grads(loss_fn)
    lc, gc = loss_and_grads(torch.compile(loss_fn, fullgraph=True))
    torch._dynamo.reset()
    torch.testing.assert_close(lc, le, rtol=1e-4, atol=1e-5)
    assert len(gc) == len(ge)
    for a, c in zip(ge, gc):
        torch.testing.assert_close(c, a, rtol=1e-3, atol=1e-5)
