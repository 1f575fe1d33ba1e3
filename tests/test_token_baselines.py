"""BPE guidance boundaries (hand-worked ASCII and non-ASCII, real multilingual text), the bpe-lm's
bits-per-byte accounting, the flat byte model's parameter match, and the FLOP counts."""

import math
import re

import numpy as np
import pytest
import torch

from conftest import shared_file
from rltok import bpe as bpe_lib
from rltok.methods import get_method
from rltok.boundaries.bpe import BoundaryCache, bpe_boundaries_for_ids
from rltok.bpe import _BYTE_SYMBOL, encode_many
from rltok.flat import ByteLM, TokenLM
from rltok.flat.token_lm import bpe_lm_score, to_tokens
from rltok.schema import BOS
from rltok.config import build_config
from rltok.data.corpus import Corpus
from rltok.data.loader import document_batches
from rltok.evaluate import evaluate_corpus
from rltok.flat.reference import reference_unet, reference_unet_params
from rltok.flops import (flat_flops, mean_causal_keys,
                         training_flops_per_byte, unet_flops)
from rltok.model.flat_lm import FlatLM, flat_params

LN2 = math.log(2)


@pytest.fixture(scope="module")
def hello_tok():
    """A BPE whose merges make exactly the tokens 'hello' and ' world' (and 'naïve', ' café')."""
    docs = ["hello world hello world.", "naïve café naïve café"] * 40
    return bpe_lib.train_bpe([d.encode() for d in docs], vocab_size=300, min_frequency=2)


def _ids(*texts: bytes) -> np.ndarray:
    row = []
    for t in texts:
        row += [BOS] + list(t)
    return np.array([row])


def test_bpe_boundaries_hand_worked_ascii(hello_tok):
    assert encode_many(hello_tok, [b"hello world"])[0][1] == [5, 6]  # 'hello', ' world'
    b = bpe_boundaries_for_ids(BoundaryCache(hello_tok), _ids(b"hello world"))
    # the spec's example: <bos> h e l l o _ w o r l d -> 1 0 0 0 0 0 1 0 0 0 0 0
    assert b[0].astype(int).tolist() == [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]


def test_bpe_boundaries_hand_worked_non_ascii(hello_tok):
    """'naïve café': tokens 'naïve' (6 bytes) and ' café' (6 bytes). The boundary sits on the space,
    byte 6 of the text, although the space is character 5: byte lengths, not character offsets."""
    text = "naïve café"
    lens = encode_many(hello_tok, [text.encode()])[0][1]
    assert lens == [6, 6]
    assert text.index(" ") == 5 and text.encode().index(b" ") == 6
    b = bpe_boundaries_for_ids(BoundaryCache(hello_tok), _ids(text.encode()))
    assert np.flatnonzero(b[0]).tolist() == [0, 1 + 6]  # BOS, and the space at input position 7


def test_boundary_cache_full_mid_batch(hello_tok):
    """A batch that overflows the cache must still get every run's boundaries, equal to an
    uncached computation (a cache cleared mid-batch used to raise KeyError in long trainings)."""
    texts = [b"hello world", b"naive cafe", b"hello cafe", b"world hello", b"cafe world"]
    fresh = [bpe_boundaries_for_ids(BoundaryCache(hello_tok), _ids(t)) for t in texts]
    cache = BoundaryCache(hello_tok, max_items=3)
    for i in range(len(texts)):
        batch = [texts[(i + k) % len(texts)] for k in range(3)]  # 2 cached runs + 1 new each time
        got = bpe_boundaries_for_ids(cache, _ids(*batch))  # one row, three BOS-separated runs
        want = np.concatenate([fresh[(i + k) % len(texts)] for k in range(3)], axis=1)
        assert np.array_equal(got, want)
        assert len(cache._d) <= 3


def test_bpe_boundaries_mid_stream_bos_and_invalid_utf8(hello_tok):
    ids = _ids(b"hello world", b"hello\xff world")
    b = bpe_boundaries_for_ids(BoundaryCache(hello_tok), ids)[0]
    second = 12  # the second BOS
    assert ids[0, second] == BOS and b[second]
    run = ids[0, second + 1:].astype(np.uint8).tobytes()
    assert run == b"hello\xff world"
    # 'hello' | 0xff (its own token) | ' world': boundaries at the 0xff byte and at the space
    assert np.flatnonzero(b[second + 1:]).tolist() == [5, 6]


def _udhr_text(name: str) -> str:
    xml = shared_file("multilingual", "udhr", name).read_text(encoding="utf-8")
    return "\n".join(re.findall(r"<para>(.*?)</para>", xml, flags=re.S))


@pytest.mark.parametrize("name", ["udhr_deu_1996.xml", "udhr_rus.xml", "udhr_cmn_hans.xml", "udhr_hin.xml"])
def test_bpe_boundaries_on_udhr(name):
    """On real multilingual text (2-, 3- and multi-byte scripts) the boundaries are exactly the byte
    offsets at which the tokens' bytes start: decoding each token back to bytes reproduces the text
    and every boundary lies at such an offset."""
    text = _udhr_text(name)
    data = text.encode()
    tok = bpe_lib.train_bpe([data], vocab_size=600)
    ids, lens = encode_many(tok, [data[:3000]])[0]
    # rebuild the bytes of every token from its ByteLevel symbols
    inv = {c: b for b, c in _BYTE_SYMBOL.items()}
    token_bytes = [bytes(inv[c] for c in tok.id_to_token(i)) for i in ids]
    assert [len(t) for t in token_bytes] == lens
    assert b"".join(token_bytes) == data[:3000]
    row = np.array([[BOS] + list(data[:3000])])
    b = bpe_boundaries_for_ids(BoundaryCache(tok), row)[0]
    starts = np.cumsum([0] + lens[:-1])[1:]  # token starts after the first
    assert np.flatnonzero(b[1:]).tolist() == starts.tolist()
    if name != "udhr_deu_1996.xml":
        # character offsets would put the boundaries elsewhere on multi-byte text
        char_starts = [o[0] for o in tok.encode(data[:3000].decode("utf-8", "ignore")).offsets][1:]
        assert char_starts != starts.tolist()


def test_bpe_method_uses_the_run_tokenizer(small_corpus_file, tmp_path, hello_tok):
    cfg = build_config("bpe", "smoke")
    bpe_lib.save_tokenizer(hello_tok, tmp_path / "tokenizer.json")
    model = get_method("bpe").build(cfg, tmp_path)
    ids = torch.from_numpy(_ids(b"hello world hello"))
    out = model(ids)
    assert np.flatnonzero(out.boundary.b[0].numpy()).tolist() == [0, 6, 12, 17]  # 17: forced last
    assert not type(model.boundary).causal


def test_bpe_setup_fits_rate(small_corpus_file, tmp_path):
    from rltok.data import load_splits

    cfg = build_config("bpe", "smoke", overrides={"data.source": str(small_corpus_file)})
    get_method("bpe").setup(cfg, load_splits(cfg).train, tmp_path)
    info = __import__("json").loads((tmp_path / "tokenizer.info.json").read_text())
    # a corpus this small cannot reach 0.2 tokens per byte: the fit keeps the largest useful
    # vocabulary and reports the rate it achieved
    assert info["vocab_size"] > 256 and 0.2 < info["rate"] < 1 and info["target_rate"] == 0.2
    assert get_method("bpe").build(cfg, tmp_path).boundary.tokenizer.get_vocab_size() == info["vocab_size"]


# -- bpe-lm -----------------------------------------------------------------------------------------

def test_bpe_lm_bits_per_byte_by_hand(hello_tok):
    """A document 'hello world hello' is tokens [hello][ world][ hello]: the model reads
    [BOS, hello, world] and predicts [hello, world, hello]; bits/byte = (sum of the three token
    NLLs) / (17 ln 2), and each NLL sits at its token's last byte."""
    torch.manual_seed(0)
    V = hello_tok.get_vocab_size()
    model = TokenLM(V, 16, 2, 1, 32, 0.2, hello_tok).eval()
    text = b"hello world hello"
    corpus = Corpus.from_docs([text, b"hello"])
    (_, batch), = list(document_batches(corpus, 64, 2))
    tb = to_tokens(model, batch.ids, batch.targets)
    h, w = hello_tok.token_to_id("hello"), hello_tok.token_to_id("Ġworld")
    hs = hello_tok.token_to_id("Ġhello")
    assert tb.inputs[0, :3].tolist() == [model.bos_id, h, w]
    assert tb.targets[0, :3].tolist() == [h, w, hs] and tb.targets[0, 3:].eq(-1).all()
    assert tb.target_pos[0, :3].tolist() == [4, 10, 16]
    assert tb.target_bytes[0, :3].tolist() == [5, 6, 6]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([[model.bos_id, h, w]])).float(), -1)[0]
    nll = [-logp[0, h].item(), -logp[1, w].item(), -logp[2, hs].item()]
    out = bpe_lm_score(model, batch)
    row = out.nll[0]
    assert torch.nonzero(row).flatten().tolist() == [4, 10, 16]
    torch.testing.assert_close(row[[4, 10, 16]], torch.tensor(nll), atol=1e-5, rtol=1e-5)
    res = evaluate_corpus(model, corpus, 64, dtype="fp32")
    assert res.per_doc_bpb[0] == pytest.approx(sum(nll) / (17 * LN2), rel=1e-5)
    assert res.bytes == 17 + 5
    # its token boundaries in the U-Net convention: BOS and the token starts ' world', ' hello'
    assert np.flatnonzero(out.boundaries[0].numpy()).tolist() == [0, 6, 12]


def test_bpe_lm_stream_window(hello_tok):
    """A training window starting inside a document: its first token is context only; BOS is a
    token (end of document) predicted after the document's last token and covering one byte."""
    torch.manual_seed(0)
    model = TokenLM(hello_tok.get_vocab_size(), 16, 2, 1, 32, 0.2, hello_tok)
    x = [ord(c) for c in "llo world"] + [BOS] + list(b"hello")
    ids, tgt = torch.tensor([x[:-1]]), torch.tensor([x[1:]])
    tb = to_tokens(model, ids, tgt)
    n = int((tb.targets >= 0).sum())
    assert tb.targets[0, n - 2].item() == model.bos_id and tb.target_bytes[0, n - 2].item() == 1
    assert tb.target_pos[0, n - 2].item() == 9 - 1  # BOS at stream position 9 is target index 8
    assert tb.inputs[0, 0].item() != model.bos_id  # the partial first token is the first input


def test_token_lm_is_causal_over_tokens():
    torch.manual_seed(0)
    model = TokenLM(300, 16, 2, 2, 32, 0.2).eval()
    ids = torch.randint(0, 300, (2, 30))
    base = model(ids)
    ids2 = ids.clone()
    ids2[:, 11:] = torch.randint(0, 300, (2, 19))
    torch.testing.assert_close(model(ids2)[:, :11], base[:, :11], atol=1e-5, rtol=1e-5)


def test_bpe_lm_matches_unet_flops(tmp_path, hello_tok):
    cfg = build_config("bpe-lm", "tiny", overrides={"flat.token_rate": 0.25})
    bpe_lib.save_tokenizer(hello_tok, tmp_path / "tokenizer.json")
    with torch.device("meta"):
        model = get_method("bpe-lm").build(cfg, tmp_path)
    ours = training_flops_per_byte(model, cfg).per_byte
    ref = unet_flops(reference_unet(cfg), cfg, cfg.boundary.target_rate).per_byte
    assert ours == pytest.approx(ref, rel=0.01)



def test_bpe_lm_body_flops_leaves_both_models_heads_out():
    """A production vocabulary (GPT-NeoX's 50,280 tokens at 0.215 tokens/byte) at `tiny`: its head
    alone costs more than the whole U-Net, so flops-matching leaves one layer and still overspends;
    body_flops matches the FLOPs without either model's output heads (the U-Net's: 2 x d x 257 at
    every byte, hand-counted)."""
    from rltok.flat.reference import reference_unet_head_flops
    from rltok.schema import N_OUTPUT_IDS

    over = {"flat.token_rate": 0.215, "flat.vocab_size": 50280}
    cfg = build_config("bpe-lm", "tiny", overrides=over)
    d = cfg.model.d_model
    assert reference_unet_head_flops(cfg) == 6 * d * N_OUTPUT_IDS * 2
    ref = unet_flops(reference_unet(cfg), cfg, cfg.boundary.target_rate).per_byte
    with torch.device("meta"):
        flops_matched = get_method("bpe-lm").build(cfg, None)
    head = 6 * d * (50280 + 1) * 0.215
    assert head > ref and len(flops_matched.blocks) == 1  # cannot be matched: the head is too dear
    cfg = build_config("bpe-lm", "tiny", overrides={**over, "flat.match": "body_flops"})
    with torch.device("meta"):
        model = get_method("bpe-lm").build(cfg, None)
    ours = training_flops_per_byte(model, cfg).per_byte
    assert len(model.blocks) > 4
    assert ours - head == pytest.approx(ref - 6 * d * N_OUTPUT_IDS * 2, rel=0.01)


def test_a_given_tokenizer_is_used_without_its_normalizer(tmp_path, hello_tok):
    """A tokenizer file with a normalizer (GPT-NeoX's NFC) would change the bytes it tokenizes
    (a decomposed é becomes 2 bytes, not 3): the run keeps it without one, so its tokens cover the
    bytes as they are."""
    import json

    from tokenizers import normalizers

    from rltok.flat.config import TokenLMConfig

    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(hello_tok.to_str())  # a copy: the fixture is shared
    tok.normalizer = normalizers.NFC()
    src = tmp_path / "nfc.json"
    tok.save(str(src))
    text = "naïve cafe\u0301 ".encode() * 20  # e + combining acute: NFC composes it
    opts = TokenLMConfig(tokenizer=str(src))
    info = bpe_lib.prepare_tokenizer(opts, 0.2, Corpus.from_docs([text]), tmp_path / "run", "test")
    assert info["normalizer_removed"] is True
    tok = bpe_lib.load_tokenizer(tmp_path / "run" / "tokenizer.json")
    assert tok.normalizer is None
    assert sum(encode_many(tok, [text])[0][1]) == len(text)
    assert json.loads(src.read_text())["normalizer"] is not None  # the user's file is left as it was


# -- bytes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["smoke", "tiny", "147M"])
def test_bytes_model_matches_unet_params(preset):
    cfg = build_config("bytes", preset, overrides={"flat.match": "params"})
    with torch.device("meta"):
        model = get_method("bytes").build(cfg, None)
    n = sum(p.numel() for p in model.parameters())
    assert n == pytest.approx(reference_unet_params(cfg), rel=2e-3)
    assert isinstance(model, ByteLM)
    assert model.window is None  # full attention: the presets' boundary.window is the rl policy's


@pytest.mark.parametrize("preset", ["tiny", "147M"])
def test_bytes_model_matches_unet_flops(preset):
    """By default the flat byte model spends the reference U-Net's training FLOPs per byte (at
    the target rate), and so has fewer parameters than it."""
    cfg = build_config("bytes", preset)
    with torch.device("meta"):
        model = get_method("bytes").build(cfg, None)
    ours = training_flops_per_byte(model, cfg).per_byte
    ref = unet_flops(reference_unet(cfg), cfg, cfg.boundary.target_rate).per_byte
    assert ours == pytest.approx(ref, rel=0.01)
    assert sum(p.numel() for p in model.parameters()) < reference_unet_params(cfg)


def test_bytes_model_is_causal():
    cfg = build_config("bytes", "smoke")
    torch.manual_seed(0)
    model = get_method("bytes").build(cfg, None).eval()
    ids = torch.randint(0, 256, (2, 40))
    base = model(ids)
    ids2 = ids.clone()
    ids2[:, 21:] = torch.randint(0, 256, (2, 19))
    torch.testing.assert_close(model(ids2)[:, :21], base[:, :21], atol=1e-5, rtol=1e-5)


def test_flat_params_formula():
    m = FlatLM(258, 257, 24, 2, 3, 50)
    assert sum(p.numel() for p in m.parameters()) == flat_params(258, 257, 24, 3, 50)


# -- FLOPs ------------------------------------------------------------------------------------------

def test_mean_causal_keys_by_hand():
    assert mean_causal_keys(4) == (1 + 2 + 3 + 4) / 4
    assert mean_causal_keys(5, window=2) == (1 + 2 + 2 + 2 + 2) / 5
    assert mean_causal_keys(3, window=10) == 2.0


def test_unet_flops_by_hand():
    """Smoke U-Net (d=32, 1+1 byte layers with MLP 32, 1 main layer with MLP 128, 2 heads of 257):
    6 x (byte-level matmul params + r x main params) + 12 d (keys per byte layer + r x keys in the
    main network)."""
    cfg = build_config("uniform", "smoke", overrides={"model.seq_len": 64, "model.window": 16})
    model = get_method("uniform").build(cfg, None)
    d = 32
    byte_layer = 4 * d * d + 3 * d * d
    main_layer = 4 * d * d + 3 * d * 4 * d
    heads = 2 * d * 257
    r = 0.25
    fc = unet_flops(model, cfg, r)
    assert fc.params_per_byte == 2 * byte_layer + heads and fc.params_per_chunk == main_layer
    keys_byte = (16 * 17 / 2 + 48 * 16) / 64
    keys_main = (16 + 1) / 2
    expect = 6 * (2 * byte_layer + heads + r * main_layer) + 12 * d * (2 * keys_byte + r * keys_main)
    assert fc.per_byte == pytest.approx(expect)
    assert fc.total(1000) == pytest.approx(1000 * expect)


def test_flat_flops_by_hand():
    m = FlatLM(258, 257, 16, 2, 2, 40)
    n = 2 * (4 * 16 * 16 + 3 * 16 * 40) + 16 * 257
    fc = flat_flops(m, 10)
    assert fc.per_byte == pytest.approx(6 * n + 12 * 16 * 2 * 5.5)
    fc = flat_flops(m, 100, token_rate=0.2)  # 20 tokens per sequence
    assert fc.per_byte == pytest.approx(0.2 * (6 * n + 12 * 16 * 2 * 10.5))
    assert fc.params_per_chunk == n and fc.params_per_byte == 0


def test_bpe_fit_documents_span_the_whole_split():
    """A split stored source by source (English pages, then German, ...) fits its BPE, and holds
    out the documents that pick the vocabulary size, from every source, not the first one."""
    from rltok.bpe import fit_docs
    from rltok.data.corpus import Corpus

    docs = [b"en %d " % i * 20 for i in range(100)] + [b"de %d " % i * 20 for i in range(100)]
    picked = fit_docs(Corpus.from_docs(docs), max_bytes=sum(map(len, docs)) // 4)
    assert 0.2 < sum(d.startswith(b"de") for d in picked) / len(picked) < 0.8
    held = picked[: max(1, len(picked) // 10)]  # fit_bpe_to_rate's held-out documents
    assert {d[:2] for d in held} == {b"en", b"de"}
    assert fit_docs(Corpus.from_docs(docs), 10**9) == fit_docs(Corpus.from_docs(docs), 10**9)  # fixed order
