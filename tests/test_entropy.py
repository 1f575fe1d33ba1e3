"""BLT's entropy patching (``--method entropy``, issue 39): the rule on hand-worked entropies, the
router's decoding step against its forward pass, causality, the threshold calibration, the frozen
entropy model through the real training loop, and its FLOPs."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rltok.boundaries.entropy import (EntropyBoundaries, byte_entropies, calibrate_threshold,
                                      next_byte_entropy, rule_boundaries)
from rltok.config import build_config
from rltok.flops import flat_flops, training_flops_per_byte
from rltok.methods import get_method
from rltok.schema import BOS, PAD

S = 40


def test_rule_on_hand_worked_entropies():
    e = torch.tensor([[0.0, 3.0, 1.0, 2.5, 2.6, 0.5, 4.0]])
    # global: e_t > 2
    assert rule_boundaries(e, "global", 2.0).int().tolist() == [[0, 1, 0, 1, 1, 0, 1]]
    # monotonic: e_t - e_{t-1} > 1 (e_{-1} = 0): 3-0, 1-3, 2.5-1, 2.6-2.5, 0.5-2.6, 4-0.5
    assert rule_boundaries(e, "monotonic", 1.0).int().tolist() == [[0, 1, 0, 1, 0, 0, 1]]


def test_entropy_of_uniform_and_certain_predictions():
    logits = torch.stack([torch.zeros(257), torch.tensor([100.0] + [0.0] * 256)])
    H = next_byte_entropy(logits)
    assert H[0].item() == pytest.approx(math.log(257), rel=1e-5)
    assert H[1].item() == pytest.approx(0.0, abs=1e-6)


def _router(rule):
    """A smoke-sized entropy U-Net whose entropy model's head is scaled up, so its entropies
    spread over [0, ln 257], with the threshold in the middle of a wide gap of this batch's
    values: no decision sits within float noise of it."""
    cfg = build_config("entropy", "smoke", overrides={"model.seq_len": S, "boundary.rule": rule})
    torch.manual_seed(0)
    model = get_method("entropy").build(cfg, None).eval()
    router = model.boundary
    with torch.no_grad():
        router.entropy_model.head.weight.mul_(30)
    ids = torch.randint(0, 256, (3, S), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = BOS
    e = byte_entropies(router.entropy_model, ids)
    v = e[:, 1:] if rule == "global" else (e - torch.nn.functional.pad(e[:, :-1], (1, 0)))[:, 1:]
    vals = v.flatten().sort().values
    mid = vals[len(vals) // 4: 3 * len(vals) // 4]
    gaps = mid[1:] - mid[:-1]
    i = int(gaps.argmax())
    assert gaps[i] > 1e-3
    router.threshold.fill_(float((mid[i] + mid[i + 1]) / 2))
    return model, router, ids


@pytest.mark.parametrize("rule", ["global", "monotonic"])
def test_step_matches_forward_and_prefill(rule):
    model, router, ids = _router(rule)
    valid = torch.ones_like(ids, dtype=torch.bool)
    out = router(None, ids, valid=valid)
    b = out.b
    assert 0.1 < b[:, 1:-1].float().mean() < 0.9  # both decisions occur
    state = None
    for t in range(S - 1):  # the last position is forced by forward, never by step
        st = router.step(None, ids[:, t], state, pos=torch.full((3,), t))
        assert torch.equal(st.b, b[:, t]), f"position {t}"
        state = st.state
        if t in (0, 7, 20):  # the state read off a forward pass over the prefix is the replayed one
            pre = router.decode_state(None, ids, out, torch.full((3,), t + 1))
            torch.testing.assert_close(pre.next_entropy, state.next_entropy, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(pre.last_entropy, state.last_entropy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rule", ["global", "monotonic"])
def test_boundaries_are_causal(rule):
    model, router, ids = _router(rule)
    valid = torch.ones_like(ids, dtype=torch.bool)
    b = router(None, ids, valid=valid).b
    g = torch.Generator().manual_seed(3)
    for t in (1, 9, 25):
        ids2 = ids.clone()
        ids2[:, t + 1:] = torch.randint(0, 256, (3, S - t - 1), generator=g)
        b2 = router(None, ids2, valid=valid).b
        # b_t depends on bytes < t only: the decision at t + 1 is unchanged too
        assert torch.equal(b2[:, : t + 2], b[:, : t + 2])


def test_calibration_hits_the_rate():
    g = torch.Generator().manual_seed(0)
    e = torch.rand(8, 100, generator=g) * 5
    valid = torch.ones_like(e, dtype=torch.bool)
    valid[0, 50:] = False
    forced = torch.zeros_like(valid)
    forced[:, 0] = True
    for rule in ("global", "monotonic"):
        t, rate = calibrate_threshold(e, valid, forced, rule, 0.2)
        b = (rule_boundaries(e, rule, t) | forced) & valid
        assert rate == pytest.approx(float(b.sum()) / float(valid.sum()))
        assert abs(rate - 0.2) < 0.005


def test_bad_rule_is_a_clean_error():
    from rltok.errors import RltokError
    with pytest.raises(RltokError, match="boundary.rule"):
        build_config("entropy", "smoke", overrides={"boundary.rule": "median"})


def test_flops_add_the_frozen_model_forward_only():
    cfg = build_config("entropy", "smoke")
    ent = get_method("entropy").build(cfg, None)
    uni = get_method("uniform").build(build_config("uniform", "smoke"), None)
    f_ent, f_uni = training_flops_per_byte(ent, cfg), training_flops_per_byte(uni, build_config("uniform", "smoke"))
    em = ent.boundary.entropy_model
    assert f_ent.params_per_byte == f_uni.params_per_byte  # the frozen weights are not trained
    assert f_ent.frozen_per_byte == pytest.approx(flat_flops(em, cfg.model.seq_len).per_byte / 3)
    assert f_ent.per_byte == pytest.approx(f_uni.per_byte + f_ent.frozen_per_byte)


def test_training_keeps_the_entropy_model_frozen(tmp_path, c4_path):
    """Setup trains and calibrates the entropy model; the U-Net's training leaves it as saved."""
    from rltok.train import train
    out = tmp_path / "ent"
    cfg = build_config("entropy", "smoke", overrides={"data.source": str(c4_path), "train.max_steps": 6,
                                                      "train.eval_docs": 4})
    train(cfg, out, progress=False)
    info = json.loads((out / "entropy_model.json").read_text())
    assert abs(info["rate"] - 0.2) < 0.01
    config = json.loads((out / "config.json").read_text())
    assert config["boundary"]["threshold"] == pytest.approx(info["threshold"])
    assert config["boundary"]["calibrate_on"] == "train_rows"
    # the threshold holds r* on the rows the U-Net trains on first: the trainer's own sampler
    from rltok.boundaries.entropy import _load_em, rule_rate
    from rltok.data import load_splits
    from rltok.data.loader import SequenceDataset
    em, _ = _load_em(cfg.boundary, out)
    ds = SequenceDataset(load_splits(cfg).train, cfg.model.seq_len, cfg.train.seed, cfg.data.packing)
    ids = ds.batch(np.arange(cfg.boundary.em_calibration_rows)).ids
    # ... as the U-Net's own boundaries give it there: forward forces each row's last valid byte too
    import dataclasses
    valid = ids != PAD
    bc = dataclasses.replace(cfg.boundary, threshold=info["threshold"])
    with torch.no_grad():
        b = EntropyBoundaries(cfg.model, bc, em).forward(None, ids, valid=valid).b
    assert float((b & valid).sum()) / float(valid.sum()) == pytest.approx(info["rate"])
    saved = load_file(str(out / "entropy_model.safetensors"))
    weights = load_file(str(out / "model.safetensors"))
    em = {k.split("entropy_model.", 1)[1]: v for k, v in weights.items() if "entropy_model." in k}
    assert em.keys() == saved.keys()
    for k in saved:
        assert torch.equal(em[k], saved[k]), k


def test_an_older_entropy_run_keeps_its_held_out_calibration():
    """A run of format <= 13 calibrated on the held-out documents; its config says so when read."""
    from rltok.config import run_config_from_dict
    d = build_config("entropy", "smoke").to_dict()
    del d["boundary"]["calibrate_on"], d["boundary"]["em_calibration_rows"]
    assert run_config_from_dict(d, strict=True, format_version=13).boundary.calibrate_on == "heldout"
    assert run_config_from_dict({**d, "boundary": {**d["boundary"], "calibrate_on": "train_rows",
                                                   "em_calibration_rows": 8}}).boundary.calibrate_on == "train_rows"
    from rltok.errors import RltokError
    with pytest.raises(RltokError, match="boundary.calibrate_on"):
        build_config("entropy", "smoke", overrides={"boundary.calibrate_on": "validation"})
