"""A byte's prediction never sees later bytes: for every U-Net method, for random, all-ones and
forced-only boundary patterns, and for the method's own (sampled) boundaries."""

import pytest
import torch

from rltok.methods import get_method, method_names
from rltok.config import build_config
from rltok.model.stage import inner_boundary_bytes

S = 48


def _model(method, **over):
    cfg = build_config(method, "smoke", overrides={"model.seq_len": S, "model.window": 8, **over})
    torch.manual_seed(0)
    m = get_method(method).build(cfg, None)
    if get_method(method).flat:
        pytest.skip(f"{method} is a flat baseline")
    return m.eval()


def _patterns():
    g = torch.Generator().manual_seed(1)
    rand = torch.rand(2, S, generator=g) < 0.3
    rand[:, 0] = rand[:, -1] = True
    ones = torch.ones(2, S, dtype=torch.bool)
    forced = torch.zeros(2, S, dtype=torch.bool)
    forced[:, 0] = forced[:, -1] = True
    return {"random": rand, "all": ones, "forced_only": forced}


def _unet_methods():
    return [m for m in method_names() if not get_method(m).flat]


@pytest.mark.parametrize("pattern", ["random", "all", "forced_only"])
@pytest.mark.parametrize("method", ["rl", "uniform"])
def test_fixed_boundaries_are_causal(method, pattern):
    model = _model(method)
    b = _patterns()[pattern]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (2, S), generator=g)
    base = model(ids, boundaries=b).logits
    for t in (0, 5, 17, 30, S - 2):
        ids2 = ids.clone()
        ids2[:, t + 1:] = torch.randint(0, 256, (2, S - t - 1), generator=g)
        b2 = b.clone()
        if pattern == "random":  # later boundaries may change too
            b2[:, t + 1:-1] = torch.rand(2, S - t - 2, generator=g) < 0.5
        out = model(ids2, boundaries=b2).logits
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method,over", [(m, {}) for m in _unet_methods()] + [("rl", {"boundary.window": 4})]
                         + [("rl", {"model.stages": 2}), ("rl", {"model.stages": 2, "boundary.window": 4})])
def test_method_boundaries_are_causal(method, over):
    """With the method drawing its own boundaries (fixed noise), outputs up to t are unchanged
    when bytes after t change, and gradients from later inputs are zero. Two stages: the inner
    router's decisions up to t are unchanged too."""
    model = _model(method, **over)
    mod = model.boundary
    if not type(mod).causal:
        pytest.skip(f"{method}: boundaries depend on later bytes by design")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (2, S), generator=g)
    noise = torch.rand(2, S, generator=g)
    base = model(ids, noise=noise)
    if len(base.levels) > 1:  # both levels decide something: inner ends, and outer-only ends
        base_inner = inner_boundary_bytes(base.levels[1], base.chunks, S)
        assert base_inner[:, 1:-1].any() and (base.boundary.b[:, 1:-1] & ~base_inner[:, 1:-1]).any()
    for t in (3, 20, S - 2):
        ids2 = ids.clone()
        ids2[:, t + 1:] = torch.randint(0, 256, (2, S - t - 1), generator=g)
        out = model(ids2, noise=noise)
        torch.testing.assert_close(out.logits[:, : t + 1], base.logits[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert torch.equal(out.boundary.b[:, 1: t + 1], base.boundary.b[:, 1: t + 1])
        if len(base.levels) > 1:
            inner = inner_boundary_bytes(out.levels[1], out.chunks, S)
            assert torch.equal(inner[:, 1: t + 1], base_inner[:, 1: t + 1])

    # gradient of the prediction at t w.r.t. the embeddings of later bytes is exactly zero
    store = {}

    def hook(_m, _inp, output):
        output.retain_grad()
        store["emb"] = output

    handle = model.embed.register_forward_hook(hook)
    t = 20
    model.train()
    out = model(ids, noise=noise)
    out.logits[:, t].float().sum().backward()
    handle.remove()
    grad = store["emb"].grad
    assert grad[:, t + 1:].abs().max().item() == 0.0
    assert grad[:, : t + 1].abs().max().item() > 0.0


def _prefix_pair(model, n_short=30, seed=4):
    """Outputs and boundaries of a short document and of a longer one that starts with it (the
    short one padded to the same width), each in its own forward pass, on the same noise."""
    from rltok.schema import PAD

    g = torch.Generator().manual_seed(seed)
    long_ids = torch.randint(0, 256, (1, S), generator=g)
    short_ids = long_ids.clone()
    short_ids[:, n_short:] = PAD
    noise = torch.rand(1, S, generator=g)
    with torch.no_grad():
        a, b = model(short_ids, noise=noise), model(long_ids, noise=noise)
    return a, b


@pytest.mark.parametrize("method,over", [(m, {}) for m in _unet_methods()] + [("rl", {"boundary.window": 4})])
def test_shared_prefix_of_documents_of_different_lengths(method, over):
    """A method that claims causality draws the same boundaries and gives the same predictions on
    a document's prefix whatever the document's length. The short document's last position is
    excluded: its boundary is forced, by design."""
    model = _model(method, **over)
    if not type(model.boundary).causal:
        pytest.skip(f"{method}: boundaries depend on later bytes or on the length by design")
    if method == "rl":
        with torch.no_grad():
            model.boundary.proj.weight.mul_(20.0)  # boundaries that follow the input
    n = 30
    a, b = _prefix_pair(model, n)
    assert torch.equal(a.boundary.b[:, : n - 1], b.boundary.b[:, : n - 1])
    torch.testing.assert_close(a.logits[:, : n - 1], b.logits[:, : n - 1], atol=1e-5, rtol=1e-5)


def test_exact_count_uniform_is_not_causal_and_says_so():
    """Negative control for the test above: the exact-count uniform cuts a shared prefix
    differently for documents of different lengths, so it must not claim causality."""
    model = _model("uniform")
    assert not type(model.boundary).causal
    n = 24
    a, b = _prefix_pair(model, n)
    assert not torch.equal(a.boundary.b[:, : n - 1], b.boundary.b[:, : n - 1])
