"""The flat baselines are not boundary methods: their own package, their own flat.* options,
their losses, scores and FLOP counts chosen by model class; an older run's boundary.* options
are read into flat.*."""

import json

import pytest
import torch

from rltok.config import build_config, run_config_from_dict
from rltok.errors import RltokError
from rltok.flat import ByteLM, BytesLMConfig, TokenLM, TokenLMConfig
from rltok.flat.bytes_lm import bytes_flops, bytes_score, bytes_training_loss
from rltok.flat.token_lm import bpe_lm_flops, bpe_lm_score, bpe_lm_training_loss
from rltok.flops import training_flops_per_byte, unet_flops
from rltok.methods import get_method, method_names
from rltok.objectives import score, training_loss, unet_score, unet_training_loss
from rltok.schema import BoundaryConfig


def test_flat_methods_are_registered_apart_from_boundary_methods():
    flat = {m for m in method_names() if get_method(m).flat}
    assert flat == {"bytes", "bpe-lm"}
    for m in method_names():
        spec = get_method(m)
        where = spec.build.__module__
        if spec.flat:
            # no boundary options of their own: the base section of the U-Net they are matched to
            assert spec.config_cls is BoundaryConfig and where.startswith("rltok.flat.")
        else:
            assert spec.flat_cls is None and where.startswith(("rltok.boundaries.", "rltok.model."))
    assert get_method("bytes").flat_cls is BytesLMConfig and get_method("bpe-lm").flat_cls is TokenLMConfig


def test_flat_options_live_in_their_own_section():
    cfg = build_config("bytes", "tiny", overrides={"flat.match": "params", "flat.window": 32})
    assert cfg.flat.match == "params" and cfg.flat.window == 32
    assert "flat" in cfg.to_dict() and "match" not in cfg.to_dict()["boundary"]
    with pytest.raises(RltokError, match="unknown config key 'boundary.match'"):
        build_config("bytes", "tiny", overrides={"boundary.match": "params"})
    with pytest.raises(RltokError, match="unknown config key 'flat.match'"):
        build_config("rl", "tiny", overrides={"flat.match": "params"})
    rl = build_config("rl", "tiny")
    assert rl.flat is None and "flat" not in rl.to_dict()
    with pytest.raises(RltokError, match=r"flat.match='x' must be flops or params"):
        build_config("bytes", "tiny", overrides={"flat.match": "x"})


def test_a_format_7_flat_run_reads_its_boundary_options_into_flat():
    new = build_config("bytes", "tiny", overrides={"flat.match": "params", "flat.window": 16,
                                                   "flat.n_layers": 3, "flat.mlp_hidden": 100}).to_dict()
    old = json.loads(json.dumps(new))
    flat = old.pop("flat")
    old["boundary"].update(flat)
    old["boundary"]["attn_window"] = old["boundary"].pop("window")  # its name up to format 7
    old["boundary"]["upsample"] = "add"  # every method had it then; a flat model has no parts
    cfg = run_config_from_dict(old, strict=True, format_version=7)
    assert cfg.flat == BytesLMConfig(n_layers=3, mlp_hidden=100, match="params", window=16)
    assert cfg.to_dict() == new
    # at format 8 the same keys under boundary.* are a mistake, named
    with pytest.raises(RltokError, match="unknown keys? boundary"):
        run_config_from_dict(old, strict=True, format_version=8)
    tok = build_config("bpe-lm", "tiny", overrides={"flat.vocab_size": 8192, "flat.token_rate": 0.3}).to_dict()
    old = json.loads(json.dumps(tok))
    old["boundary"].update(old.pop("flat"))
    cfg = run_config_from_dict(old, strict=True, format_version=7)
    assert cfg.flat.vocab_size == 8192 and cfg.flat.token_rate == 0.3 and cfg.to_dict() == tok


def test_losses_scores_and_flops_are_chosen_by_model_class():
    assert training_loss.dispatch(ByteLM) is bytes_training_loss
    assert training_loss.dispatch(TokenLM) is bpe_lm_training_loss
    assert score.dispatch(ByteLM) is bytes_score and score.dispatch(TokenLM) is bpe_lm_score
    assert training_flops_per_byte.dispatch(ByteLM) is bytes_flops
    assert training_flops_per_byte.dispatch(TokenLM) is bpe_lm_flops
    # the U-Net's are the defaults
    cfg = build_config("rl", "smoke")
    unet = get_method("rl").build(cfg, None)
    assert training_flops_per_byte(unet, cfg, 0.25).per_byte == unet_flops(unet, cfg, 0.25).per_byte
    # the byte LM's count has no rate in it
    bcfg = build_config("bytes", "smoke")
    with torch.device("meta"):
        flat = get_method("bytes").build(bcfg, None)
    assert training_flops_per_byte(flat, bcfg, 0.1).per_byte == training_flops_per_byte(flat, bcfg, 0.9).per_byte


def test_the_unet_loss_and_score_are_the_default():
    from rltok.data.loader import Batch

    cfg = build_config("uniform", "smoke", overrides={"model.seq_len": 32})
    torch.manual_seed(0)
    m = get_method("uniform").build(cfg, None)
    ids = torch.randint(0, 256, (2, 32))
    tgt = torch.randint(0, 256, (2, 32))
    noise = torch.rand(2, 32)
    batch = Batch(ids=ids, targets=tgt, noise=noise, index=torch.arange(2))
    torch.testing.assert_close(training_loss(m, batch, cfg).loss, unet_training_loss(m, batch, cfg).loss)
    torch.testing.assert_close(score(m, batch, noise=noise).nll, unet_score(m, batch, noise=noise).nll)


def test_generation_refuses_a_flat_model_in_one_line():
    from rltok.generate import generate

    cfg = build_config("bytes", "smoke")
    m = get_method("bytes").build(cfg, None)
    with pytest.raises(RltokError, match="generation supports the U-Net methods; this model is a ByteLM"):
        generate(m, ["hi"], max_new_bytes=2)
