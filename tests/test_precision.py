"""The compute dtype: ``auto`` picks the faster of bf16 and fp32 on this CPU (rltok/precision.py),
an explicit dtype is kept (with a warning when it is the slower), and the two dtypes agree on a
fixed batch within bf16 rounding.

The suite pins ``auto`` to fp32 (conftest: RLTOK_CPU_DTYPE) so that its numbers do not depend on
the CPU; these tests lift the pin and fake the probe to each answer."""

import json

import pytest
import torch

from rltok import precision
from rltok.bench import honest_mfu
from rltok.config import build_config
from rltok.data.corpus import Corpus, Splits
from rltok.errors import RltokError
from rltok.train import train


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """Lift the suite's pin, isolate the cache, and fake the matmul probe: set ``rates[0]``
    to (bf16 FLOP/s, fp32 FLOP/s); ``calls`` counts real probe calls."""
    monkeypatch.delenv(precision.PIN_ENV, raising=False)
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "_memo", {})
    monkeypatch.setattr(precision, "_warned", set())
    state = {"rates": (1e9, 5e10), "calls": 0}

    def fake(d_model=precision.DEFAULT_D_MODEL, budget_s=0.4):
        state["calls"] += 1
        return state["rates"]

    monkeypatch.setattr(precision, "measure_matmul_rates", fake)
    return state


def test_auto_picks_fp32_where_bf16_is_emulated(probe, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16_instructions", lambda: False)
    probe["rates"] = (1e9, 6e10)
    c = precision.resolve_dtype("cpu", "auto", 192)
    assert c.dtype == "fp32" and c.requested == "auto"
    assert c.describe() == "dtype: fp32 (bf16 matmul 0.001 TFLOP/s, fp32 0.06: this CPU has no bf16 instructions)"


def test_auto_picks_bf16_where_it_is_faster(probe, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16_instructions", lambda: True)
    probe["rates"] = (1.6e12, 1e12)
    c = precision.resolve_dtype("cpu", "auto", 192)
    assert c.dtype == "bf16" and "1.6x faster" in c.reason
    assert precision.explicit_warning(c) is None


def test_near_tie_keeps_fp32(probe):
    probe["rates"] = (1.05e12, 1e12)  # under BF16_MARGIN: the more exact dtype
    assert precision.resolve_dtype("cpu", "auto").dtype == "fp32"


def test_explicit_dtype_is_kept_and_warned_when_slower(probe):
    probe["rates"] = (1e9, 6e10)
    c = precision.resolve_dtype("cpu", "bf16")
    assert c.dtype == "bf16"
    w = precision.explicit_warning(c)
    assert w is not None and "fp32" in w and "60x faster" in w and "\n" not in w
    assert precision.explicit_warning(precision.resolve_dtype("cpu", "fp32")) is None
    probe["rates"] = (2e12, 1e12)  # another machine (another width: not in the cache)
    assert precision.explicit_warning(precision.resolve_dtype("cpu", "bf16", 64)) is None
    assert "bf16" in precision.explicit_warning(precision.resolve_dtype("cpu", "fp32", 64))


def test_probe_is_cached_per_machine(probe, tmp_path):
    precision.resolve_dtype("cpu", "auto", 192)
    precision.resolve_dtype("cpu", "auto", 192)
    assert probe["calls"] == 1  # the process memo
    precision._memo.clear()  # a new process on the same machine: the cache file
    precision.resolve_dtype("cpu", "auto", 192)
    assert probe["calls"] == 1
    cached = json.loads((tmp_path / "cache" / precision.PROBE_FILE).read_text())
    (key,) = cached
    assert f"torch {torch.__version__}" in key and "x192x768" in key
    precision._memo.clear()
    precision.resolve_dtype("cpu", "auto", 64)  # another width: another probe
    assert probe["calls"] == 2


def test_gpu_and_pin_need_no_probe(probe, monkeypatch):
    assert precision.resolve_dtype("cuda", "fp32").dtype == "fp32"
    monkeypatch.setenv(precision.PIN_ENV, "bf16")
    assert precision.resolve_dtype("cpu", "auto").dtype == "bf16"
    assert probe["calls"] == 0
    monkeypatch.setenv(precision.PIN_ENV, "fp16")
    with pytest.raises(RltokError, match="RLTOK_CPU_DTYPE"):
        precision.resolve_dtype("cpu", "auto")
    with pytest.raises(RltokError, match="auto, bf16, fp32"):
        precision.resolve_dtype("cpu", "fp8")


def test_real_probe_is_quick_and_sane(monkeypatch):
    import time

    t0 = time.perf_counter()
    bf16, fp32 = precision.measure_matmul_rates(192)
    assert time.perf_counter() - t0 < 1.0
    assert 1e6 < bf16 < 1e15 and 1e6 < fp32 < 1e15


def _splits(corpus_file):
    from rltok.data.sources import load_corpus

    c = load_corpus(str(corpus_file))
    return Splits(train=c, val=c.subset(list(range(2))), test=Corpus.from_docs([]))


@pytest.mark.parametrize("rates,expect", [((1e9, 6e10), "fp32"), ((2e12, 1e12), "bf16")])
def test_train_reports_and_uses_the_choice(probe, small_corpus_file, tmp_path, capsys, rates, expect):
    probe["rates"] = rates
    cfg = build_config("rl", "smoke", overrides={"train.dtype": "auto", "train.max_steps": 2})
    res = train(cfg, tmp_path / "run", progress=False, splits=_splits(small_corpus_file))
    err = capsys.readouterr().err
    assert f"rltok: dtype: {expect} (bf16 matmul" in err
    assert res.summary["dtype"] == expect
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["dtype"] == "auto"


def _first_loss(run) -> float:
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r and "event" not in r:
            return r["loss"]
    raise AssertionError("no logged loss")


def test_the_step_runs_in_the_chosen_dtype(probe, small_corpus_file, tmp_path, capsys):
    """Not only reported: the training step computes in it (the same seed and data give the fp32
    loss exactly when auto picks fp32, and another loss when it picks bf16)."""
    over = {"train.max_steps": 2, "train.log_every": 1}
    ref = train(build_config("rl", "smoke", overrides={**over, "train.dtype": "fp32"}), tmp_path / "fp32",
                progress=False, splits=_splits(small_corpus_file))
    losses = {}
    for name, rates in (("auto-fp32", (1e9, 6e10)), ("auto-bf16", (2e12, 1e12))):
        probe["rates"] = rates
        precision._memo.clear()
        (tmp_path / "cache" / precision.PROBE_FILE).unlink(missing_ok=True)
        train(build_config("rl", "smoke", overrides={**over, "train.dtype": "auto"}), tmp_path / name,
              progress=False, splits=_splits(small_corpus_file))
        losses[name] = _first_loss(tmp_path / name)
    assert ref.summary["dtype"] == "fp32" and losses["auto-fp32"] == _first_loss(tmp_path / "fp32")
    assert losses["auto-bf16"] != losses["auto-fp32"]
    assert losses["auto-bf16"] == pytest.approx(losses["auto-fp32"], rel=2e-2)


def test_train_keeps_explicit_bf16_with_one_warning(probe, small_corpus_file, tmp_path, capsys):
    probe["rates"] = (1e9, 6e10)
    cfg = build_config("rl", "smoke", overrides={"train.dtype": "bf16", "train.max_steps": 2})
    res = train(cfg, tmp_path / "run", progress=False, splits=_splits(small_corpus_file))
    err = capsys.readouterr().err
    assert res.summary["dtype"] == "bf16"
    assert err.count("warning: dtype bf16 was requested") == 1


def test_the_dtypes_agree_on_a_fixed_batch():
    """One training loss on a fixed batch, fp32 against bf16 autocast: within bf16 rounding."""
    from rltok.data.loader import Batch
    from rltok.methods import get_method
    from rltok.objectives import training_loss

    cfg = build_config("rl", "smoke")
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    g = torch.Generator().manual_seed(1)
    B, S = 4, cfg.model.seq_len
    text = (b"The quick brown fox jumps over the lazy dog. " * 8)[:B * S]
    ids = torch.tensor(list(text), dtype=torch.long).view(B, S)
    batch = Batch(ids=ids, targets=torch.roll(ids, -1, 1), noise=torch.rand(B, S, generator=g),
                  index=torch.arange(B))
    losses = {}
    for dt in ("fp32", "bf16"):
        torch.manual_seed(2)
        with precision.autocast(torch.device("cpu"), dt):
            losses[dt] = float(training_loss(model, batch, cfg).loss.detach())
    assert losses["fp32"] == pytest.approx(losses["bf16"], rel=2e-2)
    assert losses["fp32"] != losses["bf16"]  # bf16 really ran


def test_mfu_is_never_above_one():
    assert honest_mfu(0.5, 1.0) == 0.5
    assert honest_mfu(2.0, 1.0) is None  # a peak below the achieved rate: the measurement failed
    assert honest_mfu(1.0, None) is None


def test_bench_says_when_its_peak_failed(monkeypatch, capsys, small_corpus_file):
    import rltok.bench as bench
    from rltok.cli import main

    monkeypatch.setattr(bench, "measure_matmul_peak", lambda *a, **k: 1.0)  # 1 FLOP/s
    code = main(["bench", "--preset", "smoke", "--method", "rl", "--steps", "1", "--warmup", "0",
                 "--data", str(small_corpus_file), "--no-progress", "--json", "--set", "data.val_docs=2"])
    assert code == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["mfu"] is None and "measurement failed" in row["peak_source"]
