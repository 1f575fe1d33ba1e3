"""FLOP counting, `rltok bench`, and the GPU check script's syntax and CPU fallback."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

from rltok.bench import datasheet_peak, measure_matmul_peak
from rltok.methods import get_method
from rltok.cli import main
from rltok.config import build_config
from rltok.flat.reference import reference_unet
from rltok.flops import mean_causal_keys, training_flops_per_byte

REPO = Path(__file__).resolve().parents[1]


def test_mean_window_keys_hand_worked():
    # S = 7, W = 4: queries see 1, 2, 3, 4, 4, 4, 4 keys
    assert mean_causal_keys(7, 4) == pytest.approx(22 / 7)
    assert mean_causal_keys(5, 64) == pytest.approx(3.0)  # window longer than the sequence
    assert mean_causal_keys(8, 1) == 1.0
    assert mean_causal_keys(9) == pytest.approx(5.0)  # full causal: (n + 1) / 2


def test_matmul_flops_match_torch_flop_counter():
    """The analytic matmul count equals what torch's FlopCounterMode sees in a real forward
    (uniform boundaries: the same chunk count in every row, so no padded chunks)."""
    from torch.utils.flop_counter import FlopCounterMode

    import rltok.model.layers as layers

    cfg = build_config("uniform", "smoke", overrides={"model.chunk_pad_multiple": 1})
    model = get_method("uniform").build(cfg, None)
    B, S = 3, cfg.model.seq_len
    layers.PACK_MULTIPLE, saved = 1, layers.PACK_MULTIPLE  # no padding rows: the real chunks only
    ids = torch.randint(0, 256, (B, S))
    try:
        with FlopCounterMode(display=False) as fc:
            out = model(ids, noise=torch.rand(B, S))
    finally:
        layers.PACK_MULTIPLE = saved
    M = int(out.chunks.counts[0])
    assert (out.chunks.counts == M).all() and out.chunks.max_chunks == M
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    linear = counts.get("aten.mm", 0) + counts.get("aten.addmm", 0)
    f = training_flops_per_byte(model, cfg, M / S)
    assert f.matmul_per_byte / 3 * B * S == pytest.approx(linear, rel=1e-9)  # training = 3 x forward


def test_paper_147m_flops_per_byte():
    """Spec section 5: about 6 x (33.5M + 0.2 x 113.3M) = 337 MFLOP per byte, ignoring attention."""
    cfg = build_config("rl", "147M")
    with torch.device("meta"):
        model = get_method("rl").build(cfg, None)
    f = training_flops_per_byte(model, cfg, 0.2)
    assert f.params_per_byte == pytest.approx(33.5e6, rel=0.01)  # byte layers, heads, policy (d x 8)
    assert f.params_per_chunk == pytest.approx(113.3e6, rel=0.01)  # main network
    assert f.matmul_per_byte == pytest.approx(337e6, rel=0.01)
    assert 337e6 < f.per_byte < 360e6  # attention adds a few percent at 4096 bytes
    assert reference_unet(cfg) is not None


def test_peaks():
    assert datasheet_peak(torch.device("cpu"), "bf16") == (None, "cpu")
    p = measure_matmul_peak(torch.device("cpu"), "fp32", seconds=0.05, n=128)
    assert 1e6 < p < 1e14


def test_bench_cli_side_by_side(capsys, small_corpus_file):
    code = main(["bench", "--preset", "smoke", "--method", "rl,uniform", "--steps", "2", "--warmup", "1",
                 "--data", str(small_corpus_file), "--dtype", "fp32", "--no-progress", "--json",
                 "--set", "data.val_docs=2", "--peak-seconds", "0.1"])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["method"] for r in rows] == ["rl", "uniform"]
    for r in rows:
        assert r["steps"] == 2 and r["bytes_per_step"] == 4 * 64
        assert r["bytes_per_s"] == pytest.approx(r["bytes_per_step"] / r["step_s"])
        assert 0.05 < r["rate"] < 0.6
        assert r["model_flops_per_s"] == pytest.approx(r["train_flops_per_byte"] * r["bytes_per_s"])
        assert 0 < r["mfu"] < 1 and "measured" in r["peak_source"]
        assert r["peak_memory_bytes"] > 10 * 2**20
    # rl has the policy's d x w weights on top of the same network
    assert rows[0]["train_flops_per_byte"] > rows[1]["train_flops_per_byte"] * 0.9


def test_gpu_check_script_syntax_and_cpu_fallback(tmp_path, small_corpus_file, capsys):
    """gpu_check.sh parses; gpu_check.py (what it runs) passes its checks in the CPU fallback."""
    import importlib.util

    sh = REPO / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    assert "benchmarks/gpu_check.py" in sh.read_text()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run benchmarks/gpu_check.sh itself")
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    code = gpu_check.main(["--steps", "1", "--warmup", "0", "--json", str(tmp_path / "r.json"),
                           "--set", f"data.source={small_corpus_file}", "--set", "data.val_docs=2"])
    out = capsys.readouterr().out
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    checks = {x["check"]: x for x in results}
    for name in ("causality", "bf16_vs_fp32", "policy_scan_parallel", "local_attention_float32",
                 "local_attention_bfloat16"):
        assert checks[name]["ok"] is True, (name, checks.get(name))
    assert checks["bench_rl"]["bytes_per_s"] > 0 and "rl_over_uniform" in checks
    assert "CPU fallback" in out
    assert code == 0  # correctness decides the exit status; the targets are reported
    assert set(checks["rl_over_uniform"]) >= {"ratio", "ratio_target_met", "mfu_target_met"}


def test_bench_init_from_a_trained_run(capsys, small_corpus_file, tmp_path):
    """--init-from starts the method from a run's weights: a policy whose bias puts a boundary
    almost everywhere is timed at that rate, the other method is untouched."""
    from safetensors.torch import save_file

    from rltok.run import load_model
    from rltok.train import train

    cfg = build_config("rl", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 1,
                                                 "train.eval_docs": 0})
    train(cfg, tmp_path / "run", progress=False)
    model = load_model(tmp_path / "run")
    with torch.no_grad():
        model.boundary.proj.bias.fill_(8.0)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "run" / "model.safetensors"))
    code = main(["bench", "--preset", "smoke", "--method", "rl,uniform", "--steps", "1", "--warmup", "0",
                 "--data", str(small_corpus_file), "--dtype", "fp32", "--no-progress", "--json",
                 "--peak-seconds", "0.05", "--init-from", str(tmp_path / "run")])
    assert code == 0
    rows = {r["method"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["rl"]["rate"] > 0.9 and abs(rows["uniform"]["rate"] - 0.2) < 0.03
    # a run of another size: one line naming the option and the run, exit 2
    code = main(["bench", "--preset", "tiny", "--method", "rl", "--steps", "1", "--warmup", "0",
                 "--data", str(small_corpus_file), "--no-progress", "--peak-seconds", "0.05",
                 "--init-from", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"error: --init-from {tmp_path / 'run'}: its model does not match the tiny")
