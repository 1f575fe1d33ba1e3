"""KV-cached incremental decoding: caches on hand-worked examples, parity of prefill + step with
the full forward pass (fp32, tolerance 2e-5 on log-probabilities), decisions fed back as fixed
boundaries, cached == re-run decoding, determinism, stop strings, streaming, bounded memory."""

import json
import warnings

import numpy as np
import pytest
import torch

from rltok.methods import get_method, method_names
from rltok.boundaries.base import BoundaryModule, BoundaryOutput
from rltok.schema import BOS, PAD
from rltok.config import build_config
from rltok.errors import RltokError
from rltok.generate import generate, generate_until, prefill, sample_next, step
from rltok.model.layers import Block, KVCache, rope_angles
from rltok.model.unet import ByteUNet

W = 8  # byte-layer window: every test decodes past it
ATOL = 2e-5  # fp32 log-probabilities, cached vs full forward


def _model(method="rl", **over):
    cfg = build_config(method, "smoke", overrides={"model.window": W, "model.seq_len": 64, **over})
    torch.manual_seed(0)
    m = get_method(method).build(cfg, None)
    if get_method(method).flat:
        pytest.skip(f"{method} is a flat baseline")
    with torch.no_grad():  # sharper than the init so that outputs depend on the inputs
        for p in m.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
                if not p.any():  # zero-initialised parts (the rate embedding) must matter too
                    p.normal_(0, 0.3)
    return m.eval()


def _decodable():
    """(method, overrides) for every registered U-Net method that implements step, rl twice."""
    out = []
    for name in method_names():
        if get_method(name).flat:
            continue
        m = _model(name)
        if type(m.boundary).can_decode():
            out.append((name, {}))
            if name == "rl":
                out.append((name, {"boundary.window": 4}))
                # the authors' options that change what decoding carries
                out.append((name, {"dechunker.upsample": "deviation"}))
                out.append((name, {"model.shared_head": True}))
                out.append((name, {"boundary.rate_schedule": "uniform:0.1:0.3"}))
                out.append((name, {"chunker.pool": "mean"}))  # the MeanPool chunker's state
            if name == "uniform":
                out.append((name, {"dechunker.upsample": "deviation"}))
            if name == "hnet":
                out.append((name, {"boundary.rate_control": "threshold"}))
            if name == "whitespace":
                out.append((name, {"boundary.rule": "ascii"}))
    return out


DECODABLE = _decodable()
IDS = [m + "".join(f"-{k.split('.')[-1]}={v}" for k, v in o.items()) for m, o in DECODABLE]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Decoding is many tiny ops: intra-op threads only add overhead (badly so on a busy host)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@torch.no_grad()
def _full_logprobs(model, seq, b):
    """log_softmax of the full forward pass on seq (+ a padding column), boundaries fixed."""
    ids = torch.tensor([list(seq) + [PAD]])
    fixed = torch.tensor([list(b) + [True]])
    # the padding column counts as valid: it takes the forced last boundary
    out = model(ids, boundaries=fixed, valid=torch.ones_like(ids, dtype=torch.bool))
    return torch.log_softmax(out.logits[0, : len(seq)].float(), -1), out


# -- caches on hand-worked examples ----------------------------------------------------------------

def test_ring_cache_from_prefill_holds_the_last_window_positions():
    T, W_ = 7, 4
    k = torch.arange(2 * T, dtype=torch.float32).view(2, 1, T, 1)  # value = row*T + position
    pos = torch.arange(T).expand(2, T)
    c = KVCache.from_prefill(k, k.clone(), pos, torch.tensor([6, 2]), W_)
    # row 0 (6 positions): slot j holds the newest position = j mod 4 -> [4, 5, 2, 3]
    assert c.pos.tolist() == [[4, 5, 2, 3], [0, 1, -1, -1]]
    assert c.k[0, 0, :, 0].tolist() == [4, 5, 2, 3]
    assert c.k[1, 0, :2, 0].tolist() == [7, 8]
    c.write(torch.full((2, 1, 1), -1.0), torch.zeros(2, 1, 1), torch.tensor([6, 2]))
    assert c.pos.tolist() == [[4, 5, 6, 3], [0, 1, 2, -1]]


def test_growing_cache_is_ragged_and_doubles():
    k = torch.arange(10, dtype=torch.float32).view(2, 1, 5, 1)
    positions = torch.tensor([[0, 3, 7, 9, 9], [0, 2, 9, 9, 9]])
    c = KVCache.from_prefill(k, k.clone(), positions, torch.tensor([3, 2]), None, reserve=0)
    assert c.capacity == 3 and c.pos.tolist() == [[0, 3, 7], [0, 2, -1]]
    c.write(torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.tensor([12]), rows=torch.tensor([1]))
    assert c.pos.tolist() == [[0, 3, 7], [0, 2, 12]] and c.length.tolist() == [3, 3]
    c.write(torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.tensor([11]), rows=torch.tensor([0]))
    assert c.capacity == 6 and c.pos[0].tolist() == [0, 3, 7, 11, -1, -1]
    assert c.select(torch.tensor([1])).pos.tolist() == [[0, 2, 12, -1, -1, -1]]


@pytest.mark.parametrize("window", [4, None])
def test_block_step_matches_forward(window):
    torch.manual_seed(0)
    blk = Block(16, 2, 16, window, 1e-6).eval()
    T = 13
    x = torch.randn(3, T, 16)
    cos, sin = rope_angles(torch.arange(T), 8, 10000.0)
    ref = blk(x, cos, sin)
    cache = KVCache.empty(3, 2, 8, window, capacity=2)
    outs = []
    for t in range(T):
        p = torch.full((3,), t)
        c, s = rope_angles(p[:, None], 8, 10000.0)
        outs.append(blk.step(x[:, t:t + 1], c, s, cache, p))
    torch.testing.assert_close(torch.cat(outs, 1), ref, atol=1e-5, rtol=1e-5)


# -- parity with the full forward pass ------------------------------------------------------------

@pytest.mark.parametrize("method,over", DECODABLE, ids=IDS)
@pytest.mark.parametrize("batch", [1, 4])
def test_teacher_forced_decoding_matches_full_forward(method, over, batch):
    """Same bytes, same boundary decisions: prefill (prompts of different lengths, some longer
    than the window) + one step per byte gives the full forward pass's log-probabilities at every
    position, and the method's decoding state carries the decisions across the prefill."""
    model = _model(method, **over)
    g = torch.Generator().manual_seed(1)
    N = 30  # steps per row, > 3 windows
    prompt_lens = [1, 11, 3, 20][:batch]  # BOS included; rows sit at different positions
    seqs = [[BOS] + torch.randint(0, 256, (L + N - 1,), generator=g).tolist() for L in prompt_lens]
    bs = [(torch.rand(len(s), generator=g) < 0.3).tolist() for s in seqs]
    fixed0 = torch.zeros(batch, max(map(len, seqs)), dtype=torch.bool)
    for r, b in enumerate(bs):
        b[0] = True
        fixed0[r, : len(b)] = torch.tensor(b)
    pre = prefill(model, [s[:L] for s, L in zip(seqs, prompt_lens)], boundaries=fixed0)
    state = pre.state
    rows = list(range(batch))  # the prompts still being decoded
    got = {r: [torch.log_softmax(pre.logits[r].float(), -1)] for r in rows}
    for k in range(N):
        if k == N // 2 and batch > 1:  # drop a row midway, as generate does when one finishes
            rows = rows[1:]
            state = state.select(torch.arange(1, batch))
        pos = state.pos.tolist()
        assert pos == [prompt_lens[r] + k for r in rows]
        ids = torch.tensor([seqs[r][p] for r, p in zip(rows, pos)])
        fixed = torch.tensor([bs[r][p] for r, p in zip(rows, pos)])
        out = step(model, state, ids, fixed=fixed)
        assert out.boundary.b.tolist() == fixed.tolist()
        for j, r in enumerate(rows):
            got[r].append(torch.log_softmax(out.logits[j].float(), -1))
    for r, L in enumerate(prompt_lens):
        ref, _ = _full_logprobs(model, seqs[r], bs[r])
        n = len(got[r])
        assert n == (N + 1 if r in rows else N // 2 + 1)
        torch.testing.assert_close(torch.stack(got[r]), ref[L - 1: L - 1 + n], atol=ATOL, rtol=0)


@pytest.mark.parametrize("method,over", DECODABLE, ids=IDS)
def test_step_forces_a_boundary_at_bos(method, over):
    """Position 0 ends a chunk whatever the noise says (and has log-probability 0); rl with noise 1
    draws no boundary elsewhere, so the forcing is what sets it."""
    model = _model(method, **over)
    h = torch.randn(3, model.cfg.d_model)
    for u in (0.0, 1.0):
        st = model.boundary.step(h, torch.tensor([BOS, 97, 98]), None, pos=torch.tensor([0, 0, 3]),
                                 noise=torch.full((3,), u), mode="sample")
        assert st.b[:2].tolist() == [True, True]
        if st.log_prob is not None:
            assert st.log_prob[:2].tolist() == [0.0, 0.0]
        if method == "rl" and u == 1.0:
            assert not st.b[2]


def test_default_replay_state_equals_the_policy_shortcut():
    """BoundaryModule.decode_state (replaying step) and the policy's direct read agree."""
    model = _model("rl", **{"boundary.window": 4})
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 256, (3, 12), generator=g)
    ids[:, 0] = BOS
    out = model(ids, noise=torch.rand(3, 12, generator=g))
    lengths = torch.tensor([12, 2, 7])
    fast = model.boundary.decode_state(out.hidden, ids, out.boundary, lengths)
    slow = BoundaryModule.decode_state(model.boundary, out.hidden, ids, out.boundary, lengths)
    assert fast.tolist() == slow.tolist()
    assert fast[1].tolist() == [0.0, 1.0, float(out.boundary.b[1, 1])]


@pytest.mark.parametrize("method,over", DECODABLE, ids=IDS)
@pytest.mark.parametrize("batch", [1, 4])
def test_decoded_boundaries_fed_back_reproduce_decoded_logprobs(method, over, batch):
    """Sampled bytes and sampled boundaries from generate(): the full forward pass with those
    boundaries fixed gives the log-probabilities recorded while decoding."""
    model = _model(method, **over)
    prompts = ["", "Hello, world", "ab", "The quick brown fox jumps"][:batch]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = generate(model, prompts, 30, seed=3)
    for gen in res:
        seq = gen.consumed
        assert len(gen.boundaries) == len(seq) and gen.boundaries[0]
        ref, _ = _full_logprobs(model, seq, gen.boundaries)
        L = 1 + len(gen.prompt)
        want = ref[L - 1:].gather(1, torch.tensor(gen.sampled)[:, None])[:, 0]
        np.testing.assert_allclose(gen.logprobs, want.double().numpy(), atol=ATOL, rtol=0)


# methods whose decoder draws what the forward pass draws, and the two-stage U-Net (its inner
# decisions follow from the same noise; the teacher-forced tests above impose outer ones only)
SAME_NOISE = [(d, i) for d, i in zip(DECODABLE, IDS) if type(_model(d[0], **d[1]).boundary).decode_matches_forward]
SAME_NOISE += [(("rl", {"model.stages": 2}), "rl-stages=2")]


@pytest.mark.parametrize("method,over", [d for d, _ in SAME_NOISE], ids=[i for _, i in SAME_NOISE])
def test_decoding_draws_the_forward_pass_boundaries_from_the_same_noise(method, over):
    """The decoder's own decisions equal the full forward pass's with the same uniforms, and the
    cached decoder samples exactly what re-running the full model per byte samples."""
    model = _model(method, **over)
    prompts = ["x", "Hello, world, again and again"]
    for mode in ("sample", "greedy"):
        a = generate(model, prompts, 30, seed=5, boundary_mode=mode)
        b = generate(model, prompts, 30, seed=5, boundary_mode=mode, cache=False)
        for ga, gb in zip(a, b):
            assert ga.sampled == gb.sampled
            assert ga.boundaries.tolist() == gb.boundaries.tolist()
            np.testing.assert_allclose(ga.logprobs, gb.logprobs, atol=ATOL)
        from rltok.generate import row_streams

        for r, ga in enumerate(a):  # the forward pass on the noise of row r draws the same b
            noise = torch.from_numpy(row_streams(5, r, 200, 30)[0])[None, : len(ga.consumed) + 1]
            ids = torch.tensor([ga.consumed + [PAD]])
            out = model(ids, noise=noise, mode=mode, valid=torch.ones_like(ids, dtype=torch.bool))
            assert out.boundary.b[0, :-1].tolist() == ga.boundaries.tolist()
        assert any(g.boundaries[1:].any() for g in a)  # not only the forced BOS boundary


def test_batch_rows_do_not_depend_on_each_other():
    model = _model("rl", **{"boundary.window": 4})
    alone = generate(model, ["Hi"], 25, seed=9)
    together = generate(model, ["Hi", "a much longer prompt than the window"], 25, seed=9)
    assert alone[0].sampled == together[0].sampled
    np.testing.assert_allclose(alone[0].logprobs, together[0].logprobs, atol=ATOL)


def test_determinism_with_a_seed():
    model = _model()
    a = generate(model, ["Hello", "x"], 30, seed=11, temperature=0.9, top_p=0.95)
    b = generate(model, ["Hello", "x"], 30, seed=11, temperature=0.9, top_p=0.95)
    c = generate(model, ["Hello", "x"], 30, seed=12, temperature=0.9, top_p=0.95)
    assert [g.sampled for g in a] == [g.sampled for g in b]
    assert [g.boundaries.tolist() for g in a] == [g.boundaries.tolist() for g in b]
    assert [g.sampled for g in a] != [g.sampled for g in c]
    assert a.seed == 11
    d = generate(model, ["Hello"], 5)
    assert generate(model, ["Hello"], 5, seed=d.seed)[0].sampled == d[0].sampled


def test_long_generation_runs_past_the_context():
    model = _model()
    res = generate(model, ["ab"], 100, seed=0)  # seq_len is 64
    assert len(res[0].sampled) == 100 or res[0].stop_reason == "eos"
    long_prompt = bytes(range(100))  # prompts keep their last seq_len - 1 bytes
    assert generate(model, [long_prompt], 2, seed=0)[0].prompt == long_prompt[-63:]
    assert generate(model, [long_prompt], 2, seed=0, max_prompt_bytes=10)[0].prompt == long_prompt[-10:]


# -- sampling, stopping, streaming -------------------------------------------------------------

def test_sample_next_hand_worked():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    u = lambda x: torch.tensor([x])  # noqa: E731
    assert sample_next(logits, u(0.99), temperature=0).item() == 0
    assert sample_next(logits, u(0.1)).item() == 0
    assert sample_next(logits, u(0.6)).item() == 1  # cdf 0.5, 0.8, 1.0
    assert sample_next(logits, u(0.9)).item() == 2
    assert sample_next(logits, u(0.9), top_p=0.6).item() == 1  # nucleus {0, 1}: 0.9 * 0.8 -> 1
    assert sample_next(logits, u(0.99), top_p=0.5).item() == 0  # nucleus {0}
    assert sample_next(logits, u(0.99), top_k=1).item() == 0
    assert sample_next(logits, u(0.7), top_k=2).item() == 1


def test_greedy_bytes_and_stop_strings():
    model = _model()
    base = generate(model, ["Hello"], 40, temperature=0.0, seed=0)[0]
    assert base.stop_reason in ("length", "eos")
    out = base.output
    assert len(out) >= 10
    stop = out[5:8]  # a byte string that occurs in the greedy continuation
    first = out.find(stop)
    res = generate(model, ["Hello"], 40, temperature=0.0, seed=0, stop=[b"\x00\x01never", stop])[0]
    assert res.stop_reason == "stop" and res.output == out[:first]
    assert res.sampled == base.sampled[: first + len(stop)]  # stopped right after the match


def test_end_of_document_stops_and_is_not_output():
    model = _model()
    with torch.no_grad():
        model.head.bias[BOS] = 1e4  # the model predicts end of document at once
    res = generate(model, ["Hello", ""], 10, seed=0)
    assert all(g.stop_reason == "eos" and g.output == b"" and g.sampled == [BOS] for g in res)


def test_streaming_matches_the_output_and_replaces_invalid_utf8():
    model = _model()
    pieces = {0: [], 1: []}
    stop = "\x7f"
    res = generate(model, ["a", "b"], 60, seed=2, stop=[stop], stream=lambda i, t: pieces[i].append(t))
    for i, g in enumerate(res):
        assert "".join(pieces[i]) == g.text == g.output.decode("utf-8", errors="replace")
    assert any("\ufffd" in g.text for g in res)  # random weights emit invalid UTF-8: no crash


def test_streamer_holds_back_a_partial_stop_string():
    from rltok.generate import _Streamer

    got = []
    s = _Streamer(lambda i, t: got.append(t), 0, [b"END"])
    s.push(b"abcE")
    s.push(b"abcEN")
    assert "".join(got) == "abc"
    s.push(b"abcENx")
    assert "".join(got) == "abcENx"
    s.push(b"abcENx\xe2\x82")  # an incomplete UTF-8 character waits for its last byte
    assert "".join(got) == "abcENx"
    s.push(b"abcENx\xe2\x82\xac")
    assert "".join(got) == "abcENx\u20ac"


def test_bad_arguments_are_one_line_errors():
    model = _model()
    for kw in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"boundary_mode": "x"},
               {"stop": [""]}, {"top_k": -2}):
        with pytest.raises(RltokError):
            generate(model, ["a"], 5, **kw)
    with pytest.raises(RltokError):
        generate(model, ["a"], -1)
    with pytest.raises(RltokError):
        generate(model, [], 5)


def test_method_without_step_cannot_use_the_cache():
    class LookAhead(BoundaryModule):
        name = "lookahead"
        causal = False

        def forward(self, h, ids, *, valid, noise=None, fixed=None, mode="sample"):
            b = torch.ones(ids.shape, dtype=torch.bool)
            return BoundaryOutput(hard=b.float(), decided=torch.zeros_like(b))

    cfg = build_config("rl", "smoke")
    model = ByteUNet(cfg.model, LookAhead(cfg.model, cfg.boundary)).eval()
    with pytest.raises(RltokError, match="cache=False"):
        generate(model, ["a"], 3)
    res = generate(model, ["a"], 3, seed=0, cache=False)  # the re-run reference still works
    assert len(res[0].sampled) == 3 and res[0].boundaries.all()


def test_uniform_decodes_as_bernoulli_with_a_warning():
    model = _model("uniform")
    with pytest.warns(UserWarning, match="stand-in"):
        res = generate(model, ["abc"] * 4, 60, seed=0)
    rate = np.mean([g.boundaries[4:].mean() for g in res])
    assert 0.08 < rate < 0.35  # r* = 0.2


# -- memory ------------------------------------------------------------------------------------

def test_cache_memory_is_bounded_by_window_and_chunks():
    model = _model()
    short = generate(model, ["x" * 10], 20, seed=0)
    long = generate(model, ["x" * 50], 120, seed=0)
    assert short.cache_bytes["byte_layers"] == long.cache_bytes["byte_layers"]  # W slots per layer
    n_chunks = int(long[0].boundaries.sum())
    per_chunk = 2 * model.cfg.d_model * 4 * model.cfg.main_layers  # k and v, fp32
    assert long.cache_bytes["main_used"] == n_chunks * per_chunk
    assert long.cache_bytes["main_allocated"] <= 2 * (n_chunks + 16) * (per_chunk + 8 * model.cfg.main_layers)


# -- lm-eval style entry point and the model method -------------------------------------------

def test_generate_until_and_model_method():
    model = _model()
    greedy = model.generate(["Hello", "abc"], 12, temperature=0.0, seed=0)  # boundaries are sampled
    out = generate_until(model, [("Hello", {"until": ["\x00zz"], "max_gen_toks": 12}),
                                 ("abc", {"until": "\x00zz", "max_gen_toks": 12, "do_sample": False})])
    assert out == greedy.texts


# -- command line -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    from rltok.checkpoint import save_tensors_atomic
    from rltok.run import MODEL, write_config

    d = tmp_path_factory.mktemp("gen") / "run"
    d.mkdir()
    cfg = build_config("rl", "smoke", overrides={"boundary.window": 2})
    torch.manual_seed(0)
    model = get_method("rl").build(cfg, None)
    write_config(d, cfg)
    save_tensors_atomic(d / MODEL, {k: v.contiguous() for k, v in model.state_dict().items()})
    return d


def test_cli_generate_streams_one_prompt(capsys, untrained_run):
    from rltok.cli import main

    code = main(["generate", str(untrained_run), "--prompt", "Hello", "--max-bytes", "20", "--seed", "1",
                 "--show-boundaries", "--threads", "1"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert cap.out.startswith("Hello") and "chunks: " in cap.out
    assert "seed 1" in cap.err and "first byte" in cap.err


def test_cli_generate_json_batch_and_errors(capsys, untrained_run):
    from rltok.cli import main

    code = main(["generate", str(untrained_run), "--prompt", "a", "--prompt", "bc", "--max-bytes", "8",
                 "--seed", "3", "--json", "--temperature", "0"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    rows = [json.loads(x) for x in cap.out.strip().splitlines()]
    assert [r["prompt"] for r in rows] == ["a", "bc"] and all(r["seed"] == 3 for r in rows)
    code = main(["generate", str(untrained_run), "--prompt", "a", "--temperature", "-1"])
    cap = capsys.readouterr()
    assert code == 2 and cap.err.strip().splitlines()[-1].startswith("error: temperature")
    assert cap.out == ""  # nothing printed before the error
