"""Rate conditioning (boundary.rate_schedule): schedules, one-line errors, parity with the
unconditioned policy at initialisation, and a trained smoke model that runs at the rate asked."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from rltok.cli import main
from rltok.config import build_config
from rltok.errors import RltokError
from rltok.rates import parse_schedule, requested_rate
from rltok.run import build_model


@pytest.mark.parametrize("spec,kind,values,fixed", [
    ("", "fixed", (0.2,), 0),
    ("uniform:0.1:0.3", "uniform", (0.1, 0.3), 0),
    ("choice:0.1:0.2:0.3", "choice", (0.1, 0.2, 0.3), 0),
    ("uniform:0.1:0.3@1M", "uniform", (0.1, 0.3), 1_000_000),
    ("choice:0.15:0.25@500k", "choice", (0.15, 0.25), 500_000),
])
def test_schedules_parse(spec, kind, values, fixed):
    s = parse_schedule(spec, 0.2)
    assert (s.kind, s.values, s.fixed_bytes) == (kind, values, fixed)


@pytest.mark.parametrize("spec,msg", [
    ("uniform:0.3:0.1", "LO < HI"), ("uniform:0.1", "LO < HI"), ("choice:0.1", "at least two"),
    ("uniform:0:0.3", "in (0, 1)"), ("choice:0.1:1.5", "in (0, 1)"), ("uniform:a:b", "must be numbers"),
    ("ramp:0.1:0.3", "must be uniform"), ("uniform:0.1:0.3@soon", "byte count"),
    ("linear:0.1:0.3", "one starting rate"),
])
def test_bad_schedules_are_one_line(spec, msg, capsys):
    with pytest.raises(RltokError, match=re.escape(msg)):
        parse_schedule(spec, 0.2)
    assert main(["train", "--preset", "smoke", "--set", f"boundary.rate_schedule={spec}", "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "boundary.rate_schedule" in err[0]


def test_draws_are_a_function_of_seed_and_step():
    u = parse_schedule("uniform:0.1:0.3@1000", 0.2)
    assert u.at(0, 0, 42) == 0.2 and u.at(3, 999, 42) == 0.2  # the fixed phase
    draws = [u.at(s, 1000 + s, 42) for s in range(400)]
    assert draws == [u.at(s, 1000 + s, 42) for s in range(400)]  # resumable, the same on every rank
    assert all(0.1 <= r <= 0.3 for r in draws) and min(draws) < 0.12 and max(draws) > 0.28
    assert draws != [u.at(s, 1000 + s, 43) for s in range(400)]
    c = parse_schedule("choice:0.1:0.3", 0.2)
    assert {c.at(s, 0, 1) for s in range(100)} == {0.1, 0.3}


def test_a_model_refuses_rates_it_was_not_trained_for():
    fixed = build_model(build_config("rl", "smoke"))
    with pytest.raises(RltokError, match="fixed rate 0.2"):
        with requested_rate(fixed, 0.3):
            pass
    cond = build_model(build_config("rl", "smoke", overrides={"boundary.rate_schedule": "uniform:0.1:0.3"}))
    for bad, msg in ((0.05, r"outside .*\[0.1, 0.3\]"), (1.0, r"in \(0, 1\)"), (float("nan"), r"in \(0, 1\)")):
        with pytest.raises(RltokError, match=msg):
            with requested_rate(cond, bad):
                pass
    choice = build_model(build_config("rl", "smoke", overrides={"boundary.rate_schedule": "choice:0.1:0.3"}))
    with pytest.raises(RltokError, match="0.1, 0.2, 0.3 only"):
        with requested_rate(choice, 0.25):
            pass
    with pytest.raises(RltokError, match="no rate to choose"):
        with requested_rate(build_model(build_config("whitespace", "smoke")), 0.2):
            pass
    with requested_rate(cond, 0.25):
        assert cond.boundary.rate == 0.25
    assert cond.boundary.rate == 0.2  # restored after the block


@pytest.mark.parametrize("rate", [0.1, 0.27])
def test_zero_initialised_conditioning_is_the_policy_at_that_rate(rate):
    """Before training, a rate-conditioned model asked for rate r is exactly the unconditioned
    model whose target rate is r (the rate embedding starts at zero; the prior is logit(r))."""
    torch.manual_seed(0)
    cond = build_model(build_config("rl", "smoke", overrides={"boundary.rate_schedule": "uniform:0.1:0.3"})).eval()
    plain = build_model(build_config("rl", "smoke", overrides={"boundary.target_rate": rate})).eval()
    sd = {k: v for k, v in cond.state_dict().items() if "rate_embed" not in k}
    plain.load_state_dict(sd)
    ids = torch.randint(0, 256, (2, 40))
    noise = torch.rand(2, 40)
    with requested_rate(cond, rate), torch.no_grad():
        a = cond(ids, noise=noise)
    with torch.no_grad():
        b = plain(ids, noise=noise)
    assert torch.equal(a.boundary.b, b.boundary.b)
    torch.testing.assert_close(a.boundary.logits, b.boundary.logits)
    torch.testing.assert_close(a.logits, b.logits)


@pytest.fixture(scope="module")
def rate_run(tmp_path_factory):
    """A smoke model trained over rates 0.15-0.35 on the built-in code corpus (long documents, so
    evaluation windows are full as in training), with a strong rate controller (rate_weight 0.5)
    so that 200 steps suffice for it to hold each requested rate."""
    run = tmp_path_factory.mktemp("rates") / "run"
    r = subprocess.run([sys.executable, "-m", "rltok", "train", "--method", "rl", "--preset", "smoke",
                        "--set", "boundary.rate_schedule=uniform:0.15:0.35", "--set", "boundary.rate_weight=0.5",
                        "--steps", "200", "--data", "stdlib", "--out", str(run), "--no-progress", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return run


def test_a_trained_model_runs_at_the_rate_asked(rate_run, capsys, one_thread):
    got = {}
    for rate in (0.15, 0.25, 0.35):
        assert main(["eval", str(rate_run), "--rate", str(rate), "--docs", "64", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["requested_rate"] == rate
        got[rate] = d["rate"]
    assert all(abs(got[r] - r) <= 0.03 for r in got), got
    # the steps trained at rates drawn from the schedule, logged per interval
    lines = [json.loads(x) for x in (rate_run / "metrics.jsonl").read_text().splitlines()]
    req = [x["requested_rate"] for x in lines if "requested_rate" in x]
    assert req and all(0.15 <= r <= 0.35 for r in req) and max(req) - min(req) > 0.05


def test_generate_refuses_a_bad_rate_before_printing(rate_run, capsys):
    assert main(["generate", str(rate_run), "--prompt", "The", "--max-bytes", "4", "--rate", "0.5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "outside the rates" in err
    assert main(["generate", str(rate_run), "--prompt", "The", "--max-bytes", "8", "--rate", "0.3",
                 "--seed", "1"]) == 0
    import rltok

    model = rltok.load(rate_run)
    text = "The city council met on Tuesday to discuss the budget for the coming year. " * 3
    low = rltok.encode(model, text, rate=0.15, mode="sample", seed=3)
    high = rltok.encode(model, text, rate=0.35, mode="sample", seed=3)
    assert len(high) > len(low)  # the API runs the model at the rate asked
    with pytest.raises(RltokError, match="outside"):
        rltok.score(model, ["x"], rate=0.9)


# -- calibrating the rate at evaluation (evaluate.calibrate_rate) -----------------------------------

def _calibration_corpus():
    from rltok.data.corpus import Corpus

    rng = np.random.default_rng(0)
    words = [b"the", b"council", b"met", b"on", b"tuesday", b"and", b"voted", b"against", b"it"]
    return Corpus.from_docs([b" ".join(words[i] for i in rng.integers(0, len(words), 40)) + b"." for _ in range(12)])


@pytest.mark.parametrize("method,over", [("rl", {"boundary.rate_integral_gain": 1.0, "boundary.scale": 4.0}),
                                         ("rl", {"boundary.scale": 4.0}),  # the paper's penalty only
                                         ("hnet", {"boundary.rate_control": "threshold"}),
                                         ("nawrot", {})])  # its evaluation-only logit offset
@pytest.mark.parametrize("target", [0.12, 0.3])
def test_calibrate_rate_hits_the_target_on_the_calibration_text(method, over, target):
    """The knob moves (in the right direction) until the rate on the calibration documents, scored
    with the evaluation's fixed draws, is within tol of the target; scoring again gives that rate."""
    from rltok.evaluate import calibrate_rate, evaluate_corpus
    from rltok.run import build_model

    torch.manual_seed(0)
    m = build_model(build_config(method, "smoke", overrides={"model.seq_len": 64, **over})).eval()
    corpus = _calibration_corpus()
    knob = m.boundary.rate_knob()[0]
    c = calibrate_rate(m, corpus, 64, target, docs=None, dtype="fp32", tol=0.01)
    assert abs(c.rate - target) <= 0.01, c
    assert float(knob) == pytest.approx(c.value)
    again = evaluate_corpus(m, corpus, 64, dtype="fp32").rate
    assert again == pytest.approx(c.rate)
    # the knob went the way the rate had to go
    raise_rate = target > c.before_rate
    moved_up = c.value > c.before_value
    sign = m.boundary.rate_knob()[1]
    assert moved_up == (raise_rate == (sign > 0))


def test_calibrate_rate_refuses_a_router_without_a_knob_in_one_line():
    from rltok.evaluate import calibrate_rate
    from rltok.run import build_model

    for method, over in (("uniform", {}), ("hnet", {})):  # hnet without rate_control=threshold
        m = build_model(build_config(method, "smoke", overrides={"model.seq_len": 64, **over}))
        with pytest.raises(RltokError, match="no rate to calibrate"):
            calibrate_rate(m, _calibration_corpus(), 64, 0.2, docs=None, dtype="fp32")


def test_eval_calibrate_rate_from_the_command_line(small_corpus_file, tmp_path, capsys, one_thread):
    """rltok eval --calibrate-rate moves the knob to r* on the validation split and says so; a run
    whose router has none is one line and exit 2."""
    from rltok.train import train

    cfg = build_config("rl", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 4,
                                                 "train.eval_docs": 2, "boundary.rate_integral_gain": 1.0,
                                                 "boundary.target_rate": 0.3})
    train(cfg, tmp_path / "rl", progress=False)
    assert main(["eval", str(tmp_path / "rl"), "--calibrate-rate", "--json", "--dtype", "fp32"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(d["calibration"]["rate"] - 0.3) <= 0.002 and d["calibration"]["evaluations"] >= 1
    assert d["rate"] == pytest.approx(d["calibration"]["rate"])  # scored on the same split (val) here
    cfg = build_config("uniform", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 1,
                                                      "train.eval_docs": 2})
    train(cfg, tmp_path / "u", progress=False)
    # against a flat baseline (no router, so no knob): calibrates this run only
    cfg = build_config("bytes", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 1,
                                                    "train.eval_docs": 2})
    train(cfg, tmp_path / "b", progress=False)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "rl"), "--calibrate-rate", "--against", str(tmp_path / "b"), "--json",
                 "--dtype", "fp32"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "calibration" in d and "calibration" not in d["against"] and d["against"]["method"] == "bytes"
    assert main(["eval", str(tmp_path / "u"), "--calibrate-rate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no rate to calibrate" in err[0]


# -- matching the rate on each scored set (evaluate.score_at_rate) ----------------------------------

def test_nearest_pair_brackets_the_target_when_it_can():
    from rltok.evaluate import _nearest_pair

    assert _nearest_pair([0.25, 0.22, 0.18], 0.2) == (2, 1)  # below 0.18, above 0.22 (not 0.25)
    assert sorted(_nearest_pair([0.25, 0.22, 0.23], 0.2)) == [1, 2]  # all above: the two closest


def test_interpolate_results_on_a_hand_worked_pair():
    """Two scorings of the same two documents at rates 0.1 and 0.3, read at 0.15 (w = 0.25):
    per document 1 + 0.25 * (3 - 1) = 1.5 and 3 + 0.25 * (5 - 3) = 3.5, mean 2.5; counts from the first."""
    from rltok.evaluate import EvalResult, interpolate_results

    def res(per_doc, rate):
        return EvalResult(bpb=float(np.mean(per_doc)), bpb_se=0.0, corpus_bpb=float(np.mean(per_doc)), rate=rate,
                          whitespace_recall=rate * 2, whitespace_precision=0.5, docs=2, bytes=100, samples=1,
                          mode="sample", per_doc_bpb=per_doc, rates=[rate])

    r = interpolate_results(res([1.0, 3.0], 0.1), res([3.0, 5.0], 0.3), 0.25)
    assert r.per_doc_bpb == pytest.approx([1.5, 3.5])
    assert r.bpb == pytest.approx(2.5) and r.rate == pytest.approx(0.15) and r.rates == pytest.approx([0.15])
    assert r.whitespace_recall == pytest.approx(0.3) and r.bpb_se == pytest.approx(1.0)  # std([1.5, 3.5]) / sqrt(2)
    assert (r.docs, r.bytes, r.mode) == (2, 100, "sample")


@pytest.mark.parametrize("method,over", [("rl", {"boundary.rate_integral_gain": 1.0, "boundary.scale": 4.0}),
                                         ("hnet", {"boundary.rate_control": "threshold"})])
def test_score_at_rate_reads_another_domain_at_the_target(method, over):
    """Calibrated on one text, a router runs at another rate on a different text; score_at_rate
    then scores that text at a second knob value and reads it at the target: the result is the
    linear interpolation of the two scorings (checked against scoring at each value directly),
    its rate the target, the knob left at the first value. Within tol it is one scoring."""
    from rltok.data.corpus import Corpus
    from rltok.evaluate import calibrate_rate, evaluate_corpus, interpolate_results, score_at_rate
    from rltok.run import build_model

    torch.manual_seed(0)
    m = build_model(build_config(method, "smoke", overrides={"model.seq_len": 64, **over})).eval()
    cal = _calibration_corpus()
    rng = np.random.default_rng(1)
    other = Corpus.from_docs([bytes(rng.integers(33, 127, 90).astype(np.uint8)) for _ in range(6)])
    target = 0.2
    calibrate_rate(m, cal, 64, target, docs=None, dtype="fp32", tol=0.005)
    knob = m.boundary.rate_knob()[0]
    v1 = float(knob)
    plain = evaluate_corpus(m, other, 64, dtype="fp32")
    assert abs(plain.rate - target) > 0.01, "the test needs a text the calibration does not fit"
    r, match = score_at_rate(m, other, 64, target, calibration=cal, cal_docs=None, cal_tol=0.005, dtype="fp32")
    assert match.how in ("interpolated", "extrapolated") and len(match.points) in (2, 3)
    assert float(knob) == v1 and match.points[0]["value"] == v1
    assert r.rate == pytest.approx(target)
    scored = []
    for p in match.points:  # each point is what scoring at its knob value gives
        knob.fill_(p["value"])
        scored.append(evaluate_corpus(m, other, 64, dtype="fp32"))
        assert scored[-1].rate == pytest.approx(p["rate"]) and scored[-1].bpb == pytest.approx(p["bpb"])
    knob.fill_(v1)
    used = [scored[k] for k in match.pair]
    assert match.pair[0] != match.pair[1]
    want = interpolate_results(used[0], used[1], match.weight)
    assert r.per_doc_bpb == pytest.approx(want.per_doc_bpb) and r.bpb == pytest.approx(want.bpb)
    if match.how == "interpolated":  # read between a point below the target and one above
        assert min(e.rate for e in used) <= target <= max(e.rate for e in used)
    one, match1 = score_at_rate(m, other, 64, target, calibration=cal, cal_docs=None, tol=0.5, dtype="fp32")
    assert match1.how == "calibrated" and len(match1.points) == 1 and one.bpb == pytest.approx(plain.bpb)


@pytest.mark.parametrize("method,over", [("rl", {"boundary.scale": 4.0}),
                                         ("hnet", {"boundary.rate_control": "threshold"}),
                                         ("nawrot", {}), ("entropy", {"boundary.calibrate": False}),
                                         ("rl", {"boundary.scale": 4.0, "model.stages": 2})])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_rate_alone_is_the_evaluations_rate_and_calibrates_to_the_same_knob(method, over, dtype, monkeypatch):
    """corpus_rate (encoder and router only) counts the boundaries evaluate_corpus counts, at
    every knob value, first windows and whole documents; calibrate_rate, which uses it, finds the
    same knob in the same steps as with the full model."""
    import rltok.evaluate as ev
    from rltok.run import build_model

    torch.manual_seed(0)
    m = build_model(build_config(method, "smoke", overrides={"model.seq_len": 64, **over})).eval()
    with torch.no_grad():  # a policy head that reads its input (smoke models start at zero)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    corpus = _calibration_corpus()
    buf, _, lo, hi = m.boundary.rate_knob()
    for v in (lo + 0.3 * (hi - lo), float(buf)):
        buf.fill_(v)
        for whole, mode, samples in ((False, "sample", 1), (True, "sample", 2), (True, "greedy", 1)):
            kw = dict(dtype=dtype, whole=whole, batch_size=5, mode=mode, samples=samples)
            assert ev.corpus_rate(m, corpus, 64, **kw) == ev.evaluate_corpus(m, corpus, 64, **kw).rate
    start = float(buf)
    fast = ev.calibrate_rate(m, corpus, 64, 0.25, docs=None, dtype=dtype, whole=True, tol=0.005, max_evals=5)
    buf.fill_(start)
    monkeypatch.setattr(ev, "_has_unet_scorer", lambda model: False)
    slow = ev.calibrate_rate(m, corpus, 64, 0.25, docs=None, dtype=dtype, whole=True, tol=0.005, max_evals=5)
    assert fast == slow and fast.evaluations > 1


def test_score_at_rate_moves_the_knob_when_the_held_out_slice_already_sits_near_the_moved_target():
    """A scored set that misses by a little more than tol: the slice, calibrated to r* within
    cal_tol, is then also within cal_tol of the moved target, so calibrating to it leaves the knob
    where it was. The second point must still be at another knob value (the 8 MB prose study's rl
    seed 3 stopped on 'the rate did not move between knob values -0.7128 and -0.7128')."""
    from rltok.data.corpus import Corpus
    from rltok.evaluate import calibrate_rate, evaluate_corpus, score_at_rate
    from rltok.run import build_model

    torch.manual_seed(0)
    m = build_model(build_config("rl", "smoke", overrides={"model.seq_len": 64, "boundary.rate_integral_gain": 1.0,
                                                            "boundary.scale": 4.0})).eval()
    cal = _calibration_corpus()
    rng = np.random.default_rng(1)
    other = Corpus.from_docs([bytes(rng.integers(33, 127, 90).astype(np.uint8)) for _ in range(6)])
    target = 0.2
    calibrate_rate(m, cal, 64, target, docs=None, dtype="fp32", tol=0.005)
    miss = abs(evaluate_corpus(m, other, 64, dtype="fp32").rate - target)
    assert miss > 0.01
    # cal_tol 3x the miss: the slice (within 0.005 of r*) is within it of r* -/+ the miss too
    r, match = score_at_rate(m, other, 64, target, calibration=cal, cal_docs=None, cal_tol=3 * miss, tol=miss / 2,
                             dtype="fp32")
    values = [p["value"] for p in match.points]
    assert len(values) >= 2 and len(set(values)) == len(values)
    assert match.how in ("interpolated", "extrapolated") and r.rate == pytest.approx(target)
