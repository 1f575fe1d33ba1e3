"""rltok compare: method syntax, an end-to-end smoke comparison, resumability, errors."""

import json
import math

import numpy as np
import pytest
import torch

from rltok.cli import main
from rltok.compare import CompareSpec, parse_seeds, parse_variant, parse_variants, plan
from rltok.evaluate import standard_error as _se
from rltok.errors import RltokError


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_variant_syntax():
    v = parse_variant("rl:gamma=1:scale=0.0625@paper")
    assert (v.method, v.overrides, v.tag, v.n_seeds) == ("rl", {"gamma": "1", "scale": "0.0625"}, "paper", 0)
    v = parse_variant("rl:policy_scale=1/16")
    assert v.overrides == {"boundary.scale": "1/16"} and v.tag == "rl_scale=1-16"
    v = parse_variant("bytes:seeds=1")
    assert v.n_seeds == 1 and v.overrides == {} and v.tag == "bytes"
    assert [x.tag for x in parse_variants("rl,rl:gamma=1,uniform")] == ["rl", "rl_gamma=1", "uniform"]
    assert parse_seeds("1, 2,3") == [1, 2, 3]


@pytest.mark.parametrize("text,needle", [
    ("rl:gamma", "key=value"), ("rl,rl", "same tag"), ("rl:seeds=0", "seeds"), ("", "empty"),
    ("rl@", "empty tag"),
])
def test_variant_syntax_errors(text, needle):
    with pytest.raises(RltokError, match=needle):
        parse_variants(text)


def test_plan_resolves_overrides_and_seeds(tmp_path):
    spec = CompareSpec(variants=parse_variants("rl:gamma=1:policy_scale=1/16,bytes:seeds=1"),
                       out=tmp_path, preset="smoke", seeds=[3, 4], total_bytes=1000)
    runs = plan(spec)
    assert [(r.variant.tag, r.seed) for r in runs] == [("rl_gamma=1_scale=1-16", 3), ("bytes", 3),
                                                       ("rl_gamma=1_scale=1-16", 4)]
    rl = runs[0].cfg
    assert rl.boundary.gamma == 1.0 and rl.boundary.scale == 0.0625 and rl.train.seed == 3
    assert rl.train.total_bytes == 1000 and runs[1].cfg.train.total_bytes == 1000
    assert runs[0].run_dir == tmp_path / "runs" / "rl_gamma=1_scale=1-16" / "seed3"
    # --set reaches the methods that have the key, and a key no method has is refused
    runs = plan(CompareSpec(variants=parse_variants("rl,uniform"), out=tmp_path, preset="smoke",
                            overrides=["scale=0.5", "train.lr=1e-3"]))
    assert runs[0].cfg.boundary.scale == 0.5 and all(r.cfg.train.lr == 1e-3 for r in runs)
    with pytest.raises(RltokError, match="--set nonsense=2: no compared method"):
        plan(CompareSpec(variants=parse_variants("rl"), out=tmp_path, preset="smoke", overrides=["nonsense=2"]))
    with pytest.raises(RltokError, match="rl:nonsense=1.*unknown config key"):
        plan(CompareSpec(variants=parse_variants("rl:nonsense=1"), out=tmp_path, preset="smoke"))
    with pytest.raises(RltokError, match="unknown method"):
        plan(CompareSpec(variants=parse_variants("bogus"), out=tmp_path, preset="smoke"))


def test_standard_errors():
    assert _se(np.array([1.0, 3.0])) == pytest.approx(1.0)  # std 1.414 / sqrt 2
    assert math.isnan(_se(np.array([2.0])))


def _compare(capsys, out, data, methods="uniform,whitespace:rule=ascii@ws,bytes", extra=()):
    code = main(["compare", "--methods", methods, "--preset", "smoke", "--data", str(data),
                 "--bytes", "1024", "--out", str(out), "--eval-docs", "4", "--no-progress",
                 "--set", "train.eval_docs=0", *extra])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_compare_end_to_end_and_resume(capsys, small_corpus_file, tmp_path, one_thread):
    out = tmp_path / "cmp"
    code, stdout, err = _compare(capsys, out, small_corpus_file)
    assert code == 0, err
    for f in ("results.md", "results.json", "curves.png", "bpe_reference.json", "compare.json"):
        assert (out / f).is_file(), f
    res = json.loads((out / "results.json").read_text())
    methods = {m["tag"]: m for m in res["methods"]}
    assert list(methods) == ["uniform", "ws", "bytes"]
    assert res["settings"]["baseline"] == "uniform" and res["settings"]["eval_docs"] == 4
    for tag, m in methods.items():
        assert m["status"] == "done" and m["seeds"] == [1]
        assert 0 < m["bpb"] < 9 and m["bpb_se_docs"] > 0
        assert m["train_bytes"] == 1024 and m["train_flops"] > 0 and m["params"] > 0
    # every run scored the same documents: per-document lists line up, and the paired difference
    # is exactly the mean of per-document differences
    runs = {r["tag"]: r for r in res["runs"]}
    a, b = np.array(runs["ws"]["per_doc_bpb"]), np.array(runs["uniform"]["per_doc_bpb"])
    assert len(a) == len(b) == 4
    assert methods["ws"]["diff_vs_baseline"] == pytest.approx(float((a - b).mean()))
    assert abs(methods["uniform"]["rate"] - 0.2) < 0.03  # exact counts (plus forced ends)
    assert methods["ws"]["whitespace_recall"] == 1.0  # every ASCII whitespace byte ends a chunk
    assert methods["bytes"]["rate"] is None and methods["bytes"]["bpe_f1"] is None
    # bytes is sized to the U-Net's training FLOPs per byte (at r*; uniform ran at about r*)
    assert methods["bytes"]["flops_per_byte"] == pytest.approx(methods["uniform"]["flops_per_byte"], rel=0.05)
    md = (out / "results.md").read_text()
    for tag in methods:
        assert f"| {tag} | 1 |" in md
    assert "Δ vs uniform" in md and "| uniform | 1 |" in stdout

    # second invocation: nothing is trained again, the evaluations are reused
    mtimes = {p: p.stat().st_mtime for p in out.glob("runs/*/seed1/model.safetensors")}
    code, stdout, err = _compare(capsys, out, small_corpus_file)
    assert code == 0, err
    assert err.count("finished, skipped") == 3 and "training in" not in err
    assert {p: p.stat().st_mtime for p in out.glob("runs/*/seed1/model.safetensors")} == mtimes
    assert json.loads((out / "results.json").read_text())["methods"] == res["methods"]

    # a different budget for the same directory is refused, naming the run and the setting
    code, _, err = _compare(capsys, out, small_corpus_file, extra=("--bytes", "2048"))
    assert code == 2 and "train.total_bytes" in err and "Traceback" not in err


def test_compare_continues_an_interrupted_run(capsys, small_corpus_file, tmp_path, one_thread):
    from rltok.compare import CompareSpec, run_compare
    from rltok.run import is_finished
    from rltok.train import train

    out = tmp_path / "cmp"
    spec = CompareSpec(variants=parse_variants("stride"), out=out, preset="smoke", data=str(small_corpus_file),
                       total_bytes=1024, eval_docs=2, overrides=["train.eval_docs=0", "train.ckpt_every=2"])
    run_dir = plan(spec)[0].run_dir
    cfg = plan(spec)[0].cfg
    stopped = train(cfg, run_dir, progress=False, stop_at_step=2)
    assert stopped.exit_code == 130 and not is_finished(run_dir)
    res = run_compare(spec, progress=False, log=lambda m: None)
    assert is_finished(run_dir) and res["methods"][0]["status"] == "done"
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "event" not in json.loads(x)]
    assert steps == sorted(set(steps)) and steps[-1] == 4


def test_compare_cli_errors(capsys, tmp_path):
    code = main(["compare", "--methods", "rl:gamma", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().startswith("error:") and "key=value" in err
    code = main(["compare", "--methods", "rl,uniform", "--baseline", "hnet", "--preset", "smoke",
                 "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and "--baseline" in err


def test_compare_dry_run(capsys, tmp_path):
    code = main(["compare", "--methods", "rl,uniform,bytes:seeds=1", "--seeds", "1,2", "--preset", "smoke",
                 "--out", str(tmp_path / "c"), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "5 runs" in out and not (tmp_path / "c").exists()


def test_cells_off_rate_or_off_flops_are_marked():
    """A rate-targeted cell more than 0.01 off r* (at evaluation or late in training) is not
    rate-matched; a cell more than 3% from rl's training FLOPs per byte is not FLOP-matched; a
    method at its natural rate (whitespace) is neither."""
    from rltok.compare_report import mark_matching, method_table

    def cell(tag, method, rate, late, flops):
        return {"tag": tag, "method": method, "status": "done", "rate": rate, "train_rate_late": late,
                "target_rate": 0.2, "flops_per_byte": flops}

    ms = [cell("rl", "rl", 0.205, 0.199, 10e6), cell("hnet", "hnet", 0.204, 0.29, 10.2e6),
          cell("bpe", "bpe", 0.235, 0.236, 10.5e6), cell("ws", "whitespace", 0.17, 0.17, 9e6),
          {"tag": "nawrot", "method": "nawrot", "status": "pending"}]
    mark_matching(ms)
    assert [m.get("rate_matched") for m in ms[:4]] == [True, False, False, None]
    assert [m["flop_matched"] for m in ms[:4]] == [True, True, False, False]
    assert ms[2]["flops_vs_rl"] == pytest.approx(1.05)
    assert "rate_matched" not in ms[4]
