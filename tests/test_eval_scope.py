"""What an evaluation scores and with which weights: whole-document windows (hand-worked), and
every output naming the checkpoint used and whether the run finished."""

import json
import shutil

import numpy as np
import pytest
import torch

from rltok.cli import main
from rltok.schema import BOS, PAD
from rltok.data.corpus import Corpus
from rltok.data.loader import document_windows, window_starts
from rltok.evaluate import evaluate_corpus
from rltok.run import load_model


def test_window_starts_hand_worked():
    # 10 bytes, windows of 4: [0,4) all, [4,8) all, [6,10) scoring 8 and 9
    assert window_starts(10, 4, 4) == [(0, 0), (4, 4), (6, 8)]
    # stride 2: each later window scores 2 new bytes after at least 2 of context
    assert window_starts(10, 4, 2) == [(0, 0), (2, 4), (4, 6), (6, 8)]
    assert window_starts(4, 4, 1) == [(0, 0)] and window_starts(3, 4, 4) == [(0, 0)]
    assert window_starts(5, 4, 1) == [(0, 0), (1, 4)]


@pytest.mark.parametrize("n,S,stride", [(10, 4, 4), (10, 4, 2), (37, 8, 3), (8, 8, 8), (9, 8, 1), (3, 8, 8)])
def test_windows_score_every_byte_once_after_its_true_prefix(n, S, stride):
    doc = np.arange(1, n + 1, dtype=np.uint8) * 7
    corpus = Corpus.from_docs([bytes(doc)])
    scored = np.zeros(n, dtype=int)
    for docs, wins, b in document_windows(corpus, S, batch_size=3, stride=stride):
        for r in range(len(docs)):
            s = window_starts(n, S, stride)[wins[r]][0]
            for t in range(b.ids.shape[1]):
                if b.targets[r, t] < 0:
                    continue
                pos = s + t  # target byte position in the document
                scored[pos] += 1
                assert b.targets[r, t] == doc[pos]
                # the inputs before it are the document's bytes before it (BOS at the start)
                want = [BOS] + list(doc[:pos]) if s == 0 else list(doc[s - 1:pos])
                assert b.ids[r, : t + 1].tolist() == want[-(t + 1):]
                if s > 0:  # a later window keeps at least seq_len - stride bytes of context
                    assert t >= S - stride
            L = min(n - s, S)
            assert (b.ids[r, L:] == PAD).all() and (b.ids[r, :L] != PAD).all()
    assert scored.tolist() == [1] * n


def test_whole_agrees_with_first_on_documents_that_fit(smoke_runs, one_thread):
    model = load_model(smoke_runs["rl"])
    S = model.run_config.model.seq_len
    rng = np.random.default_rng(0)
    docs = [bytes(rng.integers(32, 127, size=int(k)).astype(np.uint8)) for k in (5, S, 17, S - 1)]
    corpus = Corpus.from_docs(docs)
    a = evaluate_corpus(model, corpus, S, dtype="fp32", batch_size=3)
    b = evaluate_corpus(model, corpus, S, dtype="fp32", batch_size=2, whole=True, stride=S // 2)
    assert a.per_doc_bpb == pytest.approx(b.per_doc_bpb, abs=1e-5)
    assert a.rate == pytest.approx(b.rate) and a.bytes == b.bytes
    assert a.scoring == "first" and b.scoring == f"whole:{S // 2}"


def test_whole_scores_all_bytes_of_long_documents(smoke_runs, one_thread):
    model = load_model(smoke_runs["rl"])
    S = model.run_config.model.seq_len
    docs = [b"The city council met on Tuesday. " * 9, b"short one"]
    corpus = Corpus.from_docs(docs)
    first = evaluate_corpus(model, corpus, S, dtype="fp32")
    whole = evaluate_corpus(model, corpus, S, dtype="fp32", whole=True)
    assert first.bytes == S + 9 and whole.bytes == sum(map(len, docs))
    # the short document is scored the same either way; the long one differs
    assert whole.per_doc_bpb[1] == pytest.approx(first.per_doc_bpb[1], abs=1e-5)
    # a causal byte model's total bits over the whole document split into windows: the first
    # window's bits are those of the first-S scoring
    tot_first = first.per_doc_bpb[0] * S
    tot_whole = whole.per_doc_bpb[0] * len(docs[0])
    assert tot_whole > tot_first


@pytest.fixture
def unfinished(smoke_runs, tmp_path):
    """A copy of a finished smoke run as it looks after Ctrl-C: checkpoints, no final weights."""
    run = tmp_path / "stopped"
    shutil.copytree(smoke_runs["rl"], run)
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    assert ckpts, "the smoke run keeps a checkpoint"
    return run, ckpts[-1].name


def test_load_names_the_weights(smoke_runs, unfinished):
    m = load_model(smoke_runs["rl"])
    assert m.weights == {"checkpoint": "model.safetensors", "step": 8, "finished": True}
    run, ck = unfinished
    m = load_model(run)
    assert m.weights == {"checkpoint": f"checkpoints/{ck}", "step": int(ck[5:]), "finished": False}
    m = load_model(smoke_runs["rl"], checkpoint=ck)
    assert m.weights["checkpoint"] == f"checkpoints/{ck}" and m.weights["finished"] is True


def test_eval_names_the_checkpoint(unfinished, capsys, one_thread):
    run, ck = unfinished
    assert main(["eval", str(run), "--docs", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["checkpoint"] == f"checkpoints/{ck}" and d["finished"] is False and d["step"] == int(ck[5:])
    assert d["scoring"] == "first"
    assert main(["eval", str(run), "--docs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoints/{ck}" in out and "has not finished" in out and "first 64 bytes" in out


def test_eval_refuses_an_empty_split_in_one_line(smoke_runs, capsys):
    # the smoke runs hold out no test documents (data.test_docs=0): one line, not a nan score
    assert main(["eval", str(smoke_runs["rl"]), "--split", "test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--split test" in err[0] and "data.test_docs=0" in err[0]


def test_no_documents_is_an_error_not_a_nan_score(smoke_runs, one_thread):
    from rltok.errors import RltokError
    from rltok.evaluate import calibrate_rate, evaluate_corpus
    from rltok.run import load_model

    model = load_model(smoke_runs["rl"])
    seq = model.run_config.model.seq_len
    empty = Corpus.from_docs([], name="empty.jsonl")
    with pytest.raises(RltokError, match="no documents to score in empty.jsonl"):
        evaluate_corpus(model, empty, seq)
    with pytest.raises(RltokError, match=r"\(docs=0\)"):
        evaluate_corpus(model, Corpus.from_docs([b"some text"], name="one"), seq, docs=0)
    with pytest.raises(RltokError, match="no documents"):  # a bisection on nan would return a value
        calibrate_rate(model, empty, seq, 0.2)


def test_eval_calibrate_rate_refuses_a_run_without_validation_documents(smoke_runs, capsys, monkeypatch):
    import dataclasses

    import rltok.data as data

    real = data.load_splits
    monkeypatch.setattr(data, "load_splits", lambda cfg: dataclasses.replace(real(cfg), val=Corpus.from_docs([])))
    assert main(["eval", str(smoke_runs["rl"]), "--split", "all", "--calibrate-rate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--calibrate-rate calibrates on the validation split" in err[0] and "data.val_docs" in err[0]


def test_eval_stride_needs_whole(smoke_runs, capsys):
    assert main(["eval", str(smoke_runs["rl"]), "--stride", "8"]) == 2
    assert "--stride needs --whole" in capsys.readouterr().err
    assert main(["eval", str(smoke_runs["rl"]), "--whole", "--stride", "1000"]) == 2
    assert "longer than the model's context" in capsys.readouterr().err


def test_boundaries_tasks_generate_name_the_checkpoint(unfinished, tmp_path, capsys, one_thread):
    run, ck = unfinished
    html = tmp_path / "b.html"
    assert main(["boundaries", str(run), "--text", "The city council met.", "--html", str(html)]) == 0
    page = html.read_text()
    assert f"checkpoints/{ck}" in page and "unfinished run" in page
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "The", "--max-bytes", "4", "--seed", "1"]) == 0
    assert f"checkpoints/{ck}" in capsys.readouterr().err


def test_lm_eval_metadata_names_the_checkpoint(unfinished):
    pytest.importorskip("lm_eval")
    from rltok.tasks.lm_eval_adapter import RltokLM

    run, ck = unfinished
    info = RltokLM(path=str(run)).get_model_info()
    assert info["rltok_checkpoint"] == f"checkpoints/{ck}" and info["rltok_finished"] is False


def test_boundary_enrichment_hand_worked():
    from rltok.evaluate import boundary_enrichment

    s = np.arange(1, 11, dtype=float)  # surprisal 1..10 bits
    starts = np.zeros(10, bool)
    starts[[8, 9]] = True  # chunks start on the two most surprising bytes
    d = boundary_enrichment(s, starts, top=0.2)
    assert d["boundary_enrichment"] == pytest.approx(1.0 / 0.2)
    assert d["start_surprisal_ratio"] == pytest.approx(9.5 / 5.5)
    starts = np.zeros(10, bool)
    starts[[0, 1]] = True  # on the two least surprising: none in the top fifth
    assert boundary_enrichment(s, starts, top=0.2)["boundary_enrichment"] == 0.0
    assert np.isnan(boundary_enrichment(s, np.zeros(10, bool))["boundary_enrichment"])


def test_enrichment_in_eval_is_aligned_with_the_bytes_chunks_start_on(smoke_runs, one_thread):
    """eval's enrichment equals the one computed from rltok.score's per-byte log-probs and
    boundaries (byte i ends a chunk -> byte i+1 starts one), on the same draws."""
    import rltok
    from rltok.evaluate import boundary_enrichment

    model = load_model(smoke_runs["rl"])
    S = model.run_config.model.seq_len
    docs = [b"The city council met on Tuesday to talk about the park. " * 2, b"A short one here."]
    ev = evaluate_corpus(model, Corpus.from_docs(docs), S, dtype="fp32", batch_size=2)
    sur, st = [], []
    res = rltok.score(model, [d[:S] for d in docs], seed=0)
    for lp, b in zip(res.logprobs, res.boundaries):
        n = len(lp)
        # byte i ends a chunk -> byte i+1 starts one; the decided ends are those of bytes
        # 0..n-3 (byte n-2 is the last input, a forced end; BOS's is forced too)
        sur.append(-lp[1:n - 1] / np.log(2))
        st.append(b[: n - 2])
    want = boundary_enrichment(np.concatenate(sur), np.concatenate(st))
    assert ev.boundary_enrichment == pytest.approx(want["boundary_enrichment"], rel=1e-4)
    assert ev.start_surprisal_ratio == pytest.approx(want["start_surprisal_ratio"], rel=1e-4)


@pytest.mark.parametrize("method", ["bytes", "bpe-lm"])
def test_whole_scoring_of_the_flat_models(method, tmp_path, small_corpus_file, one_thread):
    """The flat baselines under --whole: the same as first-window scoring on documents that fit,
    and every byte of a longer one scored."""
    from rltok.config import build_config
    from rltok.train import train

    cfg = build_config(method, "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 2,
                                                   "train.eval_docs": 2})
    train(cfg, tmp_path / method, progress=False)
    m = load_model(tmp_path / method)
    S = m.run_config.model.seq_len
    short = [b"The city council met on Tuesday.", b"A short one here, under the context."]
    a = evaluate_corpus(m, Corpus.from_docs(short), S, dtype="fp32")
    b = evaluate_corpus(m, Corpus.from_docs(short), S, dtype="fp32", whole=True, stride=S // 2)
    assert a.per_doc_bpb == pytest.approx(b.per_doc_bpb, abs=1e-5)
    long = [b"The city council met on Tuesday to discuss the budget for the next year. " * 3]
    c = evaluate_corpus(m, Corpus.from_docs(long), S, dtype="fp32", whole=True)
    assert c.bytes == len(long[0]) and np.isfinite(c.bpb)


def test_eval_rate_with_calibrate_rate_calibrates_to_the_requested_rate(smoke_runs, capsys):
    """``--rate R --calibrate-rate`` moves the knob until the rate on the validation split is R (it
    calibrated to boundary.target_rate = 0.2 before, and refused R for a model without a rate
    schedule although its knob reaches R)."""
    import json

    assert main(["eval", str(smoke_runs["rl"]), "--rate", "0.3", "--calibrate-rate", "--json", "--split", "val",
                 "--dtype", "fp32"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["requested_rate"] == 0.3 and d["target_rate"] == 0.3
    assert abs(d["calibration"]["rate"] - 0.3) <= 0.01, d["calibration"]
