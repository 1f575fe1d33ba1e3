"""Issue 16's two training options: temperature sampling of languages (data.language_temperature)
and one rate controller per document (boundary.rate_scope=document)."""

import numpy as np
import pytest
import torch

from rltok import estimator as est
from rltok.schema import BOS
from rltok.config import build_config
from rltok.data.corpus import Corpus
from rltok.data.languages import corpus_languages, language_bytes, reweight, temperature_shares
from rltok.errors import RltokError


def test_document_segments_start_at_bos():
    ids = torch.tensor([[BOS, 5, 5, BOS, 5], [5, 5, BOS, 5, 5]])
    seg = est.document_segments(ids, BOS)
    # row 0: two documents; row 1: the tail of an earlier document, then one document
    assert seg[0].tolist() == [1, 1, 1, 2, 2]
    assert seg[1].tolist() == [6, 6, 7, 7, 7]


def test_document_rate_penalty_moves_each_logit_by_its_documents_excess():
    """Hand-worked: the gradient on decided logit t is (pbar_doc(t) - r*) / N, with forced
    positions counted as probability 1 and undecided ones getting nothing."""
    logits = torch.tensor([[0.0, 2.0, -1.0, 0.5, 1.0, -2.0]], requires_grad=True)
    probs = torch.sigmoid(logits)
    decided = torch.tensor([[False, True, True, False, True, True]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    ids = torch.tensor([[BOS, 7, 7, BOS, 7, 7]])
    loss, pbar = est.rate_penalty(probs, logits, decided, valid, 0.2, segments=est.document_segments(ids, BOS))
    loss.backward()
    p = probs.detach()[0]
    doc0 = (1.0 + p[1] + p[2]) / 3  # position 0 is forced (probability 1)
    doc1 = (1.0 + p[4] + p[5]) / 3
    want = torch.tensor([0.0, doc0 - 0.2, doc0 - 0.2, 0.0, doc1 - 0.2, doc1 - 0.2]) / 6
    torch.testing.assert_close(logits.grad[0], want)
    assert pbar.item() == pytest.approx(((1 + p[1] + p[2]) + (1 + p[4] + p[5])).item() / 6)
    # one segment is the batch controller exactly
    logits.grad = None
    one = est.rate_penalty(probs, logits, decided, valid, 0.2, segments=torch.zeros(1, 6, dtype=torch.long))[0]
    both = est.rate_penalty(probs, logits, decided, valid, 0.2)[0]
    g1 = torch.autograd.grad(one, logits, retain_graph=True)[0]
    g2 = torch.autograd.grad(both, logits)[0]
    torch.testing.assert_close(g1, g2)


def test_document_rate_scope_through_the_training_path():
    """With pg_weight = 0, the policy's gradient under rate_scope=document weights each position by
    its own document's excess: it equals the batch controller's for a single document and differs
    from it once two documents' rates differ. (The bias alone cannot tell them apart: its gradient
    sums the excess over positions, which is the batch's excess either way.)"""
    from rltok.methods import get_method
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    def grad(scope, ids):
        cfg = build_config("rl", "smoke", overrides={
            "model.seq_len": ids.shape[1], "model.d_model": 8, "model.n_heads": 2, "model.window": 4,
            "boundary.pg_weight": 0.0, "boundary.rate_weight": 1.0, "boundary.rate_scope": scope,
            "boundary.softcap": 0.0, "boundary.scale": 1.0})
        torch.manual_seed(0)
        model = get_method("rl").build(cfg, None)
        with torch.no_grad():
            model.boundary.proj.weight.mul_(3.0)
        targets = torch.roll(ids, -1, 1)
        batch = Batch(ids=ids, targets=targets, noise=torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)),
                      index=torch.arange(ids.shape[0]))
        sl = training_loss(model, batch, cfg)
        return torch.autograd.grad(sl.loss, [model.boundary.proj.weight])[0]

    one_doc = torch.tensor([[BOS] + list(b"the cat sat on it")])
    torch.testing.assert_close(grad("document", one_doc), grad("batch", one_doc))
    two_docs = torch.tensor([[BOS] + list(b"aaaaaaaa") + [BOS] + list(b"q z. x,y")])
    g_doc, g_batch = grad("document", two_docs), grad("batch", two_docs)
    assert (g_doc - g_batch).abs().max() > 0.05 * g_batch.abs().max()


def test_content_rate_penalty_asks_each_document_for_boundaries_by_its_information():
    """Hand-worked (issue 39): two one-document rows of 4 bytes, probability 0.5 at the two decided
    positions (the ends forced): each document runs at (1 + .5 + .5 + 1) / 4 = 0.75. Row 0 holds 4
    nats, row 1 2 nats: 6 nats over 8 bytes, so r* = 0.3 asks 0.3 x 8 / 6 = 0.4 boundaries per nat,
    i.e. 0.4 x 4 / 4 = 0.4 of row 0's bytes and 0.4 x 2 / 4 = 0.2 of row 1's. The gradient on a
    decided logit is (0.75 - goal) / 8: 0.35 / 8 in row 0, 0.55 / 8 in row 1. Equal information
    per byte is the document scope exactly."""
    logits = torch.zeros(2, 4, requires_grad=True)
    decided = torch.tensor([[False, True, True, False]] * 2)
    valid = torch.ones(2, 4, dtype=torch.bool)
    ids = torch.tensor([[BOS, 7, 7, 7]] * 2)
    content = torch.tensor([[1.0] * 4, [0.5] * 4])
    seg = est.document_segments(ids, BOS)
    loss, _ = est.rate_penalty(torch.sigmoid(logits), logits, decided, valid, 0.3, segments=seg, content=content)
    (g,) = torch.autograd.grad(loss, logits)
    want = torch.tensor([[0, 0.35, 0.35, 0], [0, 0.55, 0.55, 0]]) / 8
    torch.testing.assert_close(g, want)
    same = torch.full((2, 4), 0.7)
    a = est.rate_penalty(torch.sigmoid(logits), logits, decided, valid, 0.3, segments=seg, content=same)[0]
    b = est.rate_penalty(torch.sigmoid(logits), logits, decided, valid, 0.3, segments=seg)[0]
    torch.testing.assert_close(torch.autograd.grad(a, logits)[0], torch.autograd.grad(b, logits)[0])


def test_content_rate_scope_through_the_training_path():
    """rate_scope=content reads the byte losses: with two documents of different surprisal its
    gradient differs from the document scope's (pg_weight = 0: the rate term alone)."""
    from rltok.methods import get_method
    from rltok.data.loader import Batch
    from rltok.objectives import training_loss

    ids = torch.tensor([[BOS] + list(b"aaaaaaaa") + [BOS] + list(b"q z. x,y")])

    def grad(scope):
        cfg = build_config("rl", "smoke", overrides={
            "model.seq_len": ids.shape[1], "model.d_model": 8, "model.n_heads": 2, "model.window": 4,
            "boundary.pg_weight": 0.0, "boundary.rate_weight": 1.0, "boundary.rate_scope": scope,
            "boundary.softcap": 0.0, "boundary.scale": 1.0})
        torch.manual_seed(0)
        model = get_method("rl").build(cfg, None)
        batch = Batch(ids=ids, targets=torch.roll(ids, -1, 1), index=torch.arange(1),
                      noise=torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)))
        return torch.autograd.grad(training_loss(model, batch, cfg).loss, [model.boundary.proj.weight])[0]

    g_content, g_doc = grad("content"), grad("document")
    assert (g_content - g_doc).abs().max() > 1e-3 * g_doc.abs().max()


def test_rate_scope_is_checked():
    with pytest.raises(RltokError, match="rate_scope"):
        build_config("rl", "smoke", overrides={"boundary.rate_scope": "language"})
    with pytest.raises(RltokError, match="rate_scope=content needs"):
        build_config("rl", "smoke", overrides={"boundary.rate_scope": "content", "boundary.rate_loss": "hnet"})
    with pytest.raises(RltokError, match="rate_scope=document needs"):
        build_config("rl", "smoke", overrides={"boundary.rate_scope": "document", "boundary.rate_loss": "hnet"})


def test_temperature_shares():
    q = temperature_shares({"a": 900, "b": 100}, 1.0)
    assert q == pytest.approx({"a": 0.9, "b": 0.1})
    q = temperature_shares({"a": 900, "b": 100}, 2.0)  # sqrt: 30 : 10
    assert q == pytest.approx({"a": 0.75, "b": 0.25})
    assert temperature_shares({"a": 900, "b": 100}, 1e5)["b"] == pytest.approx(0.5, abs=1e-3)


def test_reweight_gives_each_language_its_share():
    rng = np.random.default_rng(0)
    docs = [bytes(rng.integers(97, 123, 100, dtype=np.uint8)) for _ in range(200)]
    langs = ["en"] * 180 + ["el"] * 20  # 90% / 10% of the bytes
    c = Corpus.from_docs(docs)
    out = reweight(c, langs, 2.0, seed=0)
    lang_of = {__import__("hashlib").sha256(d).digest(): l for d, l in zip(docs, langs)}
    got = language_bytes(out, corpus_languages(out, lang_of))
    total = sum(got.values())
    assert got["el"] / total == pytest.approx(0.25, abs=0.02)
    assert total == pytest.approx(c.total_bytes, rel=0.03)
    # deterministic, and T = 1 changes nothing
    assert np.array_equal(reweight(c, langs, 2.0, seed=0).data, out.data)
    assert np.array_equal(reweight(c, langs, 1.0).data, c.data)


def test_language_temperature_needs_languages(tmp_path):
    from rltok.data import load_splits

    f = tmp_path / "t.txt"
    f.write_text("hello world\n" * 50)
    cfg = build_config("rl", "smoke", overrides={"data.source": str(f), "data.language_temperature": 2.0,
                                                  "data.val_docs": 0})
    with pytest.raises(RltokError, match="language_temperature needs"):
        load_splits(cfg)
    with pytest.raises(RltokError, match="language_temperature"):
        build_config("rl", "smoke", overrides={"data.language_temperature": 0.0})


def test_language_temperature_through_load_splits(tmp_path, monkeypatch):
    """On a (cached) built-in multilingual corpus, the training split is reweighted toward the
    small language, documents cut into pieces keep their language, and the held-out splits are
    untouched."""
    from rltok.data import load_splits
    from rltok.data import multilingual as ml

    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path))
    rng = np.random.default_rng(1)
    docs = [("en", bytes(rng.integers(97, 123, 300, dtype=np.uint8))) for _ in range(90)]
    docs += [("el", "αβγδ".encode() * 60 + bytes(rng.integers(97, 123, 300, dtype=np.uint8))) for _ in range(10)]
    ml.write_cached(tmp_path / ml.VERSION / "multilingual", docs)
    ml.write_cached(tmp_path / ml.VERSION / "multilingual-heldout", [("en", b"x" * 50)])
    over = {"data.source": "multilingual", "data.val_docs": 10, "data.max_doc_bytes": 200}
    natural = load_splits(build_config("rl", "smoke", overrides=over))
    warm = load_splits(build_config("rl", "smoke", overrides={**over, "data.language_temperature": 4.0}))

    def el_share(c):
        return sum(len(c.doc_bytes(i)) for i in range(len(c)) if "α".encode() in c.doc_bytes(i)) / c.total_bytes

    assert el_share(warm.train) > 2 * el_share(natural.train)
    assert np.array_equal(warm.val.data, natural.val.data)
