"""rltok plan: the memory and time model (its check against measured peaks is
benchmarks/readiness.py and the GPU run: results/scaling/readiness.json)."""

import json

import pytest

from rltok.cli import main
from rltok.config import build_config
from rltok.plan import GPUS, activation_bytes, memory_plan, time_plan


def test_activations_scale_with_the_micro_batch_and_shrink_in_bf16():
    cfg = build_config("rl", "smoke")
    a1, n1, _ = activation_bytes(cfg, 2, "fp32")
    a2, n2, _ = activation_bytes(cfg, 4, "fp32")
    assert n1 == n2 > 20
    assert a2 / a1 == pytest.approx(2.0, rel=0.1)
    b1, _, by = activation_bytes(cfg, 2, "bf16")
    assert b1 < a1 and by.get("bfloat16", 0) > 0 and by.get("float32", 0) > 0
    assert cfg.model.static_chunks == "auto"  # traced on a copy


def test_state_is_sharded_by_fsdp_and_time_scales_with_gpus():
    cfg = build_config("rl", "smoke")
    one = memory_plan(cfg, gpus=1, dtype="fp32")
    eight = memory_plan(cfg, gpus=8, dtype="fp32")
    assert one.state_bytes == 16 * one.params and eight.state_bytes == 16 * one.params // 8
    assert one.peak_bytes == one.state_bytes + one.autocast_copy_bytes + one.activation_bytes + one.transient_bytes
    t1, t8 = time_plan(cfg, "h100", 1), time_plan(cfg, "h100", 8)
    assert t1.hours["mfu=0.35"] == pytest.approx(8 * t8.hours["mfu=0.35"])
    assert t1.hours["mfu=0.35"] * 0.35 == pytest.approx(t1.hours["mfu=0.45"] * 0.45)
    assert t1.flops_per_byte * t1.total_bytes / (GPUS["h100"][1] * 0.35) / 3600 == pytest.approx(t1.hours["mfu=0.35"])


def test_plan_command(capsys):
    assert main(["plan", "--preset", "smoke", "--gpus", "2", "--gpu", "h200", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["memory"]["parallel"] == "fsdp" and p["memory"]["peak_bytes"] > 0
    assert set(p["time"]) == {"h200"} and p["time"]["h200"]["fits"]
    assert main(["plan", "--recipe", "paper-147m-fineweb", "--gpu", "all"]) == 0
    out = capsys.readouterr().out
    assert "predicted peak" in out and "8 x H100" in out and "146.9M parameters" in out
