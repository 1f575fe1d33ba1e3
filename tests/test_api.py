"""The notebook API: load, score, segment."""

import math

import numpy as np
import pytest

import rltok
from rltok.api import chunks_of
from rltok.config import build_config
from rltok.train import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, request):
    import json
    tmp = tmp_path_factory.mktemp("api")
    data = tmp / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"The quick brown fox {i} jumps over the lazy dog."}) for i in range(40)))
    cfg = build_config("rl", "smoke", overrides={"data.source": str(data), "train.eval_docs": 2})
    train(cfg, tmp / "run", progress=False)
    return tmp / "run"


def test_load_and_score(run_dir):
    model = rltok.load(run_dir)
    res = rltok.score(model, ["Hello world.", b"raw \xff bytes"], seed=1)
    assert [len(x) for x in res.logprobs] == [12, 11]
    assert all((lp <= 0).all() for lp in res.logprobs)
    assert [len(b) for b in res.boundaries] == [12, 11]
    assert len(res.bits_per_byte) == 2 and all(math.isfinite(x) for x in res.bits_per_byte)
    again = rltok.score(model, ["Hello world."], seed=1)
    np.testing.assert_allclose(again.logprobs[0], res.logprobs[0], atol=1e-5)


def test_fixed_boundaries_are_used(run_dir):
    model = rltok.load(run_dir)
    text = "aaaa bbbb cccc"
    b = [int(c == " ") for c in text]
    res = rltok.score(model, [text], boundaries=[b])
    got = res.boundaries[0].astype(int).tolist()
    # byte i sits at input position i + 1: the last input position is a forced boundary, and the
    # last byte is not an input (reported as a boundary)
    assert got[:-2] == b[:-2] and got[-2:] == [1, 1]


def test_segment_roundtrips_the_text(run_dir):
    model = rltok.load(run_dir)
    for text in ("The quick brown fox.", "naïve café — 日本語のテキスト"):
        pieces = rltok.segment(model, text, mode="sample", seed=3)
        assert "".join(pieces) == text
    raw = "naïve".encode()
    assert b"".join(rltok.segment(model, raw)) == raw


def test_chunks_of():
    assert chunks_of(b"abcdef", np.array([0, 1, 0, 0, 1, 0])) == [b"ab", b"cde", b"f"]


# -- encode: the tokenizer-like API ----------------------------------------------------------------

def test_encoding_hand_worked():
    from rltok.api import Encoding

    text = "hé ab"  # bytes: h, 0xC3, 0xA9, ' ', a, b
    data = text.encode()
    # a boundary after 0xC3 (inside é) and after ' '; the last byte always ends a chunk
    enc = Encoding(text=text, data=data, boundaries=np.array([0, 1, 0, 1, 0, 1], dtype=bool))
    assert enc.offsets == [(0, 2), (2, 4), (4, 6)] and len(enc) == 3
    assert enc.chunks == [b"h\xc3", b"\xa9 ", b"ab"]
    assert enc.strings == ["hé", " ", "ab"]  # the split character is kept whole
    assert enc.char_offsets == [(0, 2), (2, 3), (3, 5)]
    assert "".join(text[a:b] for a, b in enc.char_offsets) == text
    raw = Encoding(text=data, data=data, boundaries=enc.boundaries)
    assert raw.char_offsets is None and raw.strings[0] == "h\ufffd"


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_encode_is_score_with_every_byte_an_input(run_dir, mode):
    model = rltok.load(run_dir)
    texts = ["The quick brown fox.", "jumps over"]
    encs = rltok.encode_batch(model, texts, mode=mode, seed=4)
    # score() predicts the text's bytes, so its last byte is no input: add one placeholder byte
    res = rltok.score(model, [t + "\0" for t in texts], mode=mode, seed=4)
    for t, e, b in zip(texts, encs, res.boundaries):
        n = len(t.encode())
        assert e.boundaries.tolist() == b[:n].tolist() and e.boundaries[-1]
        assert b"".join(e.chunks) == t.encode()


def test_encode_long_text_windows_give_every_byte_its_own_boundary():
    """A rule-based method makes every boundary known: across the overlapping windows of a text
    8x the context, each byte's boundary must be the rule's (an index error shifts or drops
    them), with the text's last byte ending a chunk."""
    from rltok.run import build_model

    cfg = build_config("whitespace", "smoke", overrides={"boundary.rule": "ascii"})
    model = build_model(cfg).eval()
    model.run_config = cfg
    rng = np.random.default_rng(1)
    words = ["a", "bb", "ccc", "dddd", "eeeee"]
    text = " ".join(rng.choice(words, size=200))
    S = cfg.model.seq_len
    assert len(text) > 8 * S
    enc = rltok.encode(model, text)
    want = np.array([c == " " for c in text])
    want[-1] = True
    assert enc.boundaries.tolist() == want.tolist()
    assert rltok.segment(model, text) == [w + " " for w in text.split(" ")[:-1]] + [text.split(" ")[-1]]


def test_encode_long_text_with_the_policy_covers_the_text(run_dir):
    model = rltok.load(run_dir)
    text = "The quick brown fox jumps over the lazy dog. " * 12
    enc = rltok.encode(model, text, mode="sample", seed=2)
    assert b"".join(enc.chunks) == text.encode() and enc.offsets[-1][1] == len(text)
    # the first window's boundaries are those of the text's start on its own
    head = rltok.encode(model, text[:40], mode="sample", seed=2)
    assert enc.boundaries[:39].tolist() == head.boundaries[:39].tolist()


def test_readme_python_examples_run(run_dir, tmp_path, monkeypatch):
    """The README's Python API and model-sharing examples run as written (on a smoke run in
    place of runs/tiny; push_to_hub, which needs the network, is left out)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = []
    for title in ("## Python API", "### Sharing models"):
        section = readme[readme.index(title):]
        blocks.append(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    code = "\n".join(blocks).replace('"runs/tiny"', repr(str(run_dir)))
    code = "\n".join(line for line in code.splitlines() if "push_to_hub" not in line)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert isinstance(namespace["enc"], rltok.Encoding)
    assert (tmp_path / "export" / "tiny-rl" / "README.md").is_file()
