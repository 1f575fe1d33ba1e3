"""Issue 39's FLORES report (tools/multilingual_study.py): the CV of chunks per content, its ratio
to the same-data BPE per seed, the one-sided test against the 0.8 goal and the bpb price, on
records worked by hand."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LANGS = ("eng_Latn", "fra_Latn", "rus_Cyrl")  # three of the 26 training languages


@pytest.fixture()
def ms(monkeypatch):
    sys.path.insert(0, str(REPO / "tools"))  # flores_section imports the studies' paired test from tools/
    try:
        import multilingual_study as m
        monkeypatch.setattr(m, "_reference_translated", lambda *a: ([], {"line_positions": 4, "line_positions_removed": 0.25,
                                                                          "languages": {}}))
        yield m
    finally:
        sys.path.pop(0)


def _rows(chunks_rel, bpb):
    return [{"lang": lang, "script": lang[-4:], "bytes": 1000, "bytes_rel": 1.0, "chunks:m": 200 * c, "bpb:m": bpb,
             "chunks_rel:m": c, "bits_rel:m": 1.0, "bytes_per_chunk:m": 5 / c} for lang, c in zip(LANGS, chunks_rel)]


def _record(method, seed, chunks_rel, bpb, scope="batch"):
    return {"method": method, "seed": seed, "rate_scope": scope, "flores_calibration": {"rate": 0.2},
            "flores": _rows(chunks_rel, bpb)}


def test_the_flores_verdict_tests_each_seeds_cv_ratio_against_the_goal(ms):
    from rltok.data.languages import FLORES_OF
    assert set(LANGS) <= set(FLORES_OF.values())
    rl = [_record("rl", s, (1, 1, r), 3.2) for s, r in ((1, 2.0), (2, 2.2), (3, 1.8))]
    content = [_record("rl", s, (1, 1 + e, 1 - e), 3.3, "content") for s, e in ((1, 0.1), (2, 0.2), (3, 0.05))]
    toks = {"tokenizers": ["bpe-same-data"],
            "flores": [{"lang": lang, "script": lang[-4:], "bytes_rel": 1.0, "tokens_rel:bpe-same-data": t,
                        "bytes_per_token:bpe-same-data": 4.0} for lang, t in zip(LANGS, (1, 1.5, 0.5))]}
    fl = ms.flores_section({"rl": rl, "rl-content": content}, toks)
    bpe_cv = fl["tokenizers"]["bpe-same-data"]["cv_tokens_per_content"]["cv"]
    assert bpe_cv == pytest.approx((1 / 6) ** 0.5)  # population std of (1, 1.5, 0.5) over its mean 1
    # rl-content, seed 1: chunks (1, 1.1, 0.9): CV = sqrt(0.02 / 3) / 1; over the BPE's CV: 0.2
    r = fl["methods"]["rl-content"]["ratio_to_same_data_bpe"]
    assert r["per_seed"] == pytest.approx([0.2, 0.4, 0.1])
    assert r["mean"] == pytest.approx(0.7 / 3) and r["se"] == pytest.approx(0.0881917, rel=1e-5)
    assert r["p_below_goal"] == pytest.approx(0.01165, abs=2e-4) and r["meets_goal"]  # t = -6.43, 2 d.o.f.
    # rl, seed 1: chunks (1, 1, 2): CV 0.35355, ratio 0.866: above the goal
    assert fl["methods"]["rl"]["ratio_to_same_data_bpe"]["per_seed"][0] == pytest.approx(0.8660254)
    assert not fl["methods"]["rl"]["ratio_to_same_data_bpe"]["meets_goal"]
    assert fl["methods"]["rl-content"]["bpb_minus_rl"]["mean"] == pytest.approx(0.1)
    # chunks over bytes of the training languages: (200 + 200 + 400) / 3000 at seed 1, 840 / 3000, 760 / 3000
    assert fl["methods"]["rl"]["rate_trained"]["per_seed"] == pytest.approx([0.8 / 3, 0.28, 0.76 / 3])
    v = ms.flores_verdict(fl)
    assert v["reached_by"] == ["rl-content"]
    assert fl["per_language"]["rus_Cyrl"]["rl"]["chunks_rel"]["mean"] == pytest.approx(2.0)
    assert "rl-content" in ms.flores_tables(fl)
