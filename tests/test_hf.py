"""rltok models inside Hugging Face transformers (rltok.hf), offline, on a smoke-size model.

* the export loads with AutoConfig / AutoModelForCausalLM / AutoTokenizer and
  ``trust_remote_code=True`` in a process where rltok cannot be imported (a subprocess run with
  ``python -I``, outside the repository, with a finder that refuses ``rltok``), and its forward
  and generate there give what rltok gives here;
* the wrapper's logits equal rltok's within 1e-5 (fp32): the U-Net's forward, its prefill, and
  the scorer behind ``rltok tasks`` and the lm-eval adapter;
* ``generate`` is rltok's cached decoding: the same bytes for the same seed;
* lm-eval's ``hf`` backend scores PIQA items with the log-likelihoods of the ``rltok`` adapter
  (both with greedy boundaries: the wrapper's forward is deterministic, and the adapter's
  ``greedy_boundaries=true`` makes its scores so);
* the export is what ``save_pretrained`` writes by default, without transformers: its JSON files
  are those transformers' own ``save_pretrained`` writes;
* ``rltok.from_pretrained`` / ``rltok.load`` read an export (and a run-layout save) from JSON and
  safetensors and never run a ``.py`` file of the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from conftest import SHARED_DATA  # noqa: E402

import rltok  # noqa: E402
import rltok.generate as rltok_generate_module  # noqa: E402
from rltok.config import build_config  # noqa: E402
from rltok.errors import RltokError  # noqa: E402
from rltok.generate import generate  # noqa: E402
from rltok.hf import RltokForCausalLM, bundle_files, save_for_transformers, to_transformers  # noqa: E402
from rltok.hub import save_pretrained  # noqa: E402
from rltok.model.inference import _with_end_column  # noqa: E402
from rltok.run import build_model  # noqa: E402
from rltok.schema import BOS, PAD  # noqa: E402
from rltok.tasks.scoring import Request, score_requests  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ_LEN = 256  # PIQA's longest choices fit the window; longer items are left-truncated
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hé, général Kenobi!", "a"]


def _model(method: str = "rl", **overrides):
    torch.manual_seed(0)
    cfg = build_config(method, "smoke", overrides={"model.seq_len": SEQ_LEN, **overrides})
    m = build_model(cfg)
    m.run_config = cfg
    if method == "rl":  # untrained, the policy's probabilities sit near the target rate (no greedy
        with torch.no_grad():  # boundaries at all): spread them so that greedy chunks vary
            m.boundary.proj.bias.zero_()
            m.boundary.proj.weight.mul_(5)
    return m.eval()


def _ids(text: str) -> list[int]:
    return [BOS, *text.encode()]


@pytest.fixture(scope="module")
def net():
    return _model("rl")


@pytest.fixture(scope="module")
def export(net, tmp_path_factory):
    return net.save_pretrained(tmp_path_factory.mktemp("hf") / "export-rl")  # the default


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# -- the folder ---------------------------------------------------------------------------------------

def test_export_layout(export, net):
    names = {p.name for p in export.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json",
            "configuration_rltok.py", "modeling_rltok.py", "tokenization_rltok.py", "README.md",
            "rltok_model_unet.py", "rltok_generate.py"} <= names
    d = json.loads((export / "config.json").read_text())
    assert d["model_type"] == "rltok" and d["architectures"] == ["RltokForCausalLM"]
    assert d["auto_map"]["AutoModelForCausalLM"] == "modeling_rltok.RltokForCausalLM"
    assert d["auto_map"]["AutoTokenizer"][0] == "tokenization_rltok.RltokByteTokenizer"
    assert d["run_config"]["method"] == "rl" and d["run_config"]["model"] == net.run_config.to_dict()["model"]
    assert d["max_position_embeddings"] == SEQ_LEN - 1 and d["vocab_size"] == 258
    assert (d["bos_token_id"], d["eos_token_id"], d["pad_token_id"]) == (BOS, BOS, PAD)
    tc = json.loads((export / "tokenizer_config.json").read_text())
    assert tc["auto_map"]["AutoTokenizer"][0] == "tokenization_rltok.RltokByteTokenizer"
    card = (export / "README.md").read_text()
    assert "library_name: transformers" in card and "trust_remote_code=True" in card
    assert (save_pretrained(net, export.parent / "explicit", transformers=True) / "config.json").read_text() == \
        (export / "config.json").read_text()


def test_export_files_are_what_transformers_writes(export, net, tmp_path):
    """rltok writes the export's JSON files without transformers: they are transformers' own
    save_pretrained's (less its version and keys at their defaults), so that nothing drifts."""
    from rltok.hf import RltokByteTokenizer

    hf = to_transformers(net, boundary_mode="sample")
    hf.save_pretrained(tmp_path / "hf")
    RltokByteTokenizer().save_pretrained(tmp_path / "hf")
    ours = save_for_transformers(hf, tmp_path / "ours")  # an RltokForCausalLM: its boundary_mode
    defaults = {"transformers_version": None, "_from_model_config": True, "output_attentions": False,
                "output_hidden_states": False, "model_max_length": 1000000000000000019884624838656}
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        a = json.loads((ours / name).read_text())
        b = json.loads((tmp_path / "hf" / name).read_text())
        diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
        assert all(k in defaults and (k not in a) for k in diff), (name, diff)
    assert {p.name for p in ours.glob("*.py")} == {p.name for p in (tmp_path / "hf").glob("*.py")}
    assert json.loads((ours / "config.json").read_text())["boundary_mode"] == "sample"
    from safetensors import safe_open

    with safe_open(str(ours / "model.safetensors"), "pt") as f:
        assert f.metadata()["format"] == "pt" and set(f.keys()) == {f"model.{k}" for k in net.state_dict()}


def test_bundle_is_flat_self_contained_and_line_preserving(export):
    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    files = bundle_files()
    for name in ("configuration_rltok.py", "modeling_rltok.py", "tokenization_rltok.py"):
        needed = {os.path.basename(f) for f in get_relative_import_files(str(export / name))}
        assert needed <= set(files)  # every file transformers will copy is there
    needed = {os.path.basename(f) for f in get_relative_import_files(str(export / "modeling_rltok.py"))}
    assert needed == set(files) - {"modeling_rltok.py"}  # and it copies all of them with the model
    for name in files:  # no absolute rltok import anywhere (transformers would require it installed)
        assert "rltok" not in get_imports(str(export / name)), name
    # only the relative imports change, each on its own line: tracebacks name rltok's line numbers
    orig = (Path(rltok.__file__).parent / "model" / "unet.py").read_text().splitlines()
    flat = files["rltok_model_unet.py"].splitlines()
    changed = [a for a, b in zip(orig, flat) if a != b]
    assert len(flat) > len(orig) and changed and all(a.startswith("from .") for a in changed)
    assert "from .rltok_model_router import BoundaryOutput, Router" in flat


# -- forward: rltok's logits ----------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["rl", "whitespace", "hnet"])
def test_forward_logits_equal_rltok(method, net):
    m = net if method == "rl" else _model(method)
    hf = to_transformers(m)
    assert hf.model is m  # the same module: no copy
    ids = torch.tensor([_ids(TEXTS[0])])
    T = ids.shape[1]
    with torch.no_grad():
        out = hf(ids)
        ref = m(ids, mode="greedy")  # the forced last boundary changes only the last position's output
        last = m.prefill([ids[0].tolist()], mode="greedy").logits
    assert out.logits.shape == (1, T, 258) and out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits[0, :-1, :257], ref.logits[0, :-1], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits[0, -1, :257], last[0], atol=1e-5, rtol=0)
    assert (out.logits[..., PAD] == torch.finfo(torch.float32).min).all()
    assert torch.equal(out.boundaries[0, :-1], ref.boundary.b[0, :-1].bool())
    if method == "rl":
        assert 0.05 < out.boundaries.float().mean() < 0.8  # greedy chunks of varied length


def test_forward_log_probs_equal_the_rltok_scorer(net):
    """What lm-eval reads: log p(continuation byte) at each position, as rltok's scorer gives it
    (which feeds one byte more and ignores its prediction)."""
    hf = to_transformers(net)
    ctx, cont = b"Question: how do you open a jar?\nAnswer:", b" twist the lid"
    ref = score_requests(net, [Request(ctx, cont)], mode="greedy", details=True, dtype="fp32")[0]
    ids = torch.tensor([[BOS, *ctx, *cont[:-1]]])
    with torch.no_grad():
        lp = torch.log_softmax(hf(ids).logits.float(), -1)[0]
    got = lp[len(ctx): len(ctx) + len(cont)].gather(1, torch.tensor(list(cont))[:, None])[:, 0]
    torch.testing.assert_close(got.double(), torch.from_numpy(ref.logprobs).double(), atol=1e-5, rtol=0)
    assert float(-got.sum()) == pytest.approx(ref.nll, abs=1e-4)


def test_padded_batches_and_sampled_boundaries(net):
    hf = to_transformers(net)
    rows = [_ids(t) for t in TEXTS]
    T = max(map(len, rows))
    left = torch.full((len(rows), T), PAD)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for r, s in enumerate(rows):  # left padding, as generation pipelines pad
        left[r, T - len(s):] = torch.tensor(s)
        mask[r, T - len(s):] = 1
    with torch.no_grad():
        batch = hf(left, attention_mask=mask)
        for r, s in enumerate(rows):
            one = hf(torch.tensor([s])).logits[0]
            torch.testing.assert_close(batch.logits[r, T - len(s):], one, atol=1e-5, rtol=0)
            assert (batch.logits[r, : T - len(s), :257] == 0).all()
        # sampled boundaries: the uniforms given per position, as rltok's forward reads them
        ids = torch.tensor([rows[0]])
        u = torch.rand(1, ids.shape[1], generator=torch.Generator().manual_seed(3))
        out = hf(ids, boundary_mode="sample", noise=u)
        S = ids.shape[1] + 1
        ref = net(torch.nn.functional.pad(ids, (0, 1), value=PAD), noise=torch.nn.functional.pad(u, (0, 1)),
                  mode="sample", valid=_with_end_column(torch.tensor([S - 1]), S))
        torch.testing.assert_close(out.logits[0, :, :257], ref.logits[0, :-1], atol=1e-5, rtol=0)
        assert not torch.equal(out.boundaries, hf(ids).boundaries)  # sampling differs from greedy here
        # labels: the usual shifted cross-entropy
        loss = hf(ids, labels=ids).loss
        want = torch.nn.functional.cross_entropy(hf(ids).logits[0, :-1], ids[0, 1:])
        torch.testing.assert_close(loss, want)


# -- generate: rltok's cached decoding ------------------------------------------------------------------

def test_generate_is_rltok_cached_decoding(net, monkeypatch):
    hf = to_transformers(net)
    monkeypatch.setattr(rltok_generate_module, "RecomputeEngine", None)  # the uncached engine is not used
    prompts = [TEXTS[0].encode(), TEXTS[1].encode()]
    T = max(len(p) for p in prompts) + 1
    ids = torch.full((2, T), PAD)
    mask = torch.zeros(2, T, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, T - len(p) - 1:] = torch.tensor(_ids(p.decode()))
        mask[r, T - len(p) - 1:] = 1

    def new_ids(out, r):
        return [x for x in out[r, T:].tolist() if x != PAD]

    # default: greedy bytes and greedy boundaries (deterministic)
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=24)
    ref = generate(net, prompts, 24, temperature=0.0, boundary_mode="greedy", seed=0, dtype="fp32")
    assert torch.equal(out[:, :T], ids)  # the prompt rows, padding and all, then the new ids
    assert [new_ids(out, r) for r in range(2)] == [g.sampled for g in ref]
    # sampling with a seed: the bytes of rltok generate with that seed
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=0.8, seed=7,
                      boundary_mode="sample")
    ref = generate(net, prompts, 24, temperature=0.8, boundary_mode="sample", seed=7, dtype="fp32")
    assert [new_ids(out, r) for r in range(2)] == [g.sampled for g in ref]
    # no seed: torch's generator draws it, so torch.manual_seed reproduces a call
    torch.manual_seed(1)
    a = hf.generate(ids[:1], max_new_tokens=8, do_sample=True)
    torch.manual_seed(1)
    assert torch.equal(a, hf.generate(ids[:1], max_new_tokens=8, do_sample=True))
    d = hf.generate(ids[:1], max_new_tokens=8, do_sample=True, seed=3, num_return_sequences=2,
                    return_dict_in_generate=True)
    assert d.sequences.shape[0] == 2
    with pytest.raises(NotImplementedError, match="num_beams"):
        hf.generate(ids[:1], max_new_tokens=4, num_beams=2)
    with pytest.raises(TypeError, match="unsupported"):
        hf.generate(ids[:1], max_new_tokens=4, frobnicate=True)


# -- the Auto classes with rltok: register(), and rltok.from_pretrained ---------------------------------

def test_register_loads_the_export_with_this_rltok(export, net):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from rltok.hf import RltokByteTokenizer, RltokConfig, register

    register()
    assert type(AutoConfig.from_pretrained(export)) is RltokConfig
    m = AutoModelForCausalLM.from_pretrained(export)  # no remote code: the registered classes
    assert type(m) is RltokForCausalLM and _same_weights(m.model, net)
    tok = AutoTokenizer.from_pretrained(export)
    assert type(tok) is RltokByteTokenizer
    enc = tok(TEXTS[1])
    assert enc.input_ids == _ids(TEXTS[1]) and tok.decode(enc.input_ids, skip_special_tokens=True) == TEXTS[1]
    with torch.no_grad():
        torch.testing.assert_close(m(torch.tensor([enc.input_ids])).logits,
                                   to_transformers(net)(torch.tensor([enc.input_ids])).logits, atol=1e-6, rtol=0)


def test_rltok_from_pretrained_reads_the_export(export, net):
    m = rltok.from_pretrained(export)
    assert type(m) is type(net) and _same_weights(m, net)
    assert m.run_config.to_dict() == net.run_config.to_dict()
    assert m.weights["finished"] is False  # an in-memory model: no final evaluation to claim


def _booby_trap(folder, marker):
    trap = f"open({str(marker)!r}, 'w').write(__name__)\nraise SystemExit('booby trap ran')\n"
    for p in list(folder.glob("*.py")):
        p.write_text(trap)
    for name in ("modeling_rltok.py", "modeling_evil.py", "rltok.py", "hub.py", "run.py", "__init__.py"):
        (folder / name).write_text(trap)


def test_rltok_from_pretrained_never_runs_code_from_the_folder(export, net, tmp_path):
    marker = tmp_path / "ran"
    trapped_export = tmp_path / "export"
    shutil.copytree(export, trapped_export)
    plain = save_pretrained(net, tmp_path / "plain", transformers=False)
    before = set(sys.modules)
    for folder in (trapped_export, plain):
        _booby_trap(folder, marker)
        for load in (rltok.from_pretrained, rltok.load):
            assert _same_weights(load(folder), net)
    assert not marker.exists()
    for name in set(sys.modules) - before:
        f = getattr(sys.modules[name], "__file__", None) or ""
        assert str(tmp_path) not in f, name


def test_rltok_reads_and_writes_an_export_without_transformers(export, net):
    code = ("import sys; sys.modules['transformers'] = None\n"  # import transformers now fails
            "import torch, rltok\n"
            f"m = rltok.from_pretrained({str(export)!r})\n"
            "torch.save(m.state_dict(), sys.argv[1])\n"
            "rltok.load(m.save_pretrained(sys.argv[2]))\n")
    out, again = export.parent / "no-transformers.pt", export.parent / "saved-without-transformers"
    r = subprocess.run([sys.executable, "-c", code, str(out), str(again)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    sd = torch.load(out)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in sd.items()) and sd.keys() == net.state_dict().keys()
    for name in ["config.json", "tokenizer_config.json", "generation_config.json"] + [p.name for p in export.glob("*.py")]:
        assert (again / name).read_bytes() == (export / name).read_bytes(), name


def test_method_files_travel_in_the_config(tmp_path, small_corpus_file):
    """A BPE-guided U-Net reads its tokenizer.json when it is built: the export carries it in
    config.json (method_files), so that transformers (local folder or Hub) and rltok both have it."""
    from rltok.train import train

    cfg = build_config("bpe", "smoke", overrides={"data.source": str(small_corpus_file), "train.max_steps": 2,
                                                  "train.eval_docs": 2})
    train(cfg, tmp_path / "bpe", progress=False)
    m = rltok.load(tmp_path / "bpe")
    out = save_for_transformers(m, tmp_path / "export")
    shutil.rmtree(tmp_path / "bpe")  # the export stands alone
    assert "tokenizer.json" in json.loads((out / "config.json").read_text())["method_files"]
    assert not (out / "tokenizer.json").exists()  # no clash with a transformers tokenizer file
    m2 = rltok.from_pretrained(out)
    assert _same_weights(m, m2) and m2.weights["finished"] is True and (out / "summary.json").is_file()
    hf = RltokForCausalLM.from_pretrained(out)
    ids = torch.tensor([_ids(TEXTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, to_transformers(m2)(ids).logits, atol=1e-6, rtol=0)
    with pytest.raises(RltokError, match="run directory is gone"):
        to_transformers(m)


def test_flat_baselines_are_refused(tmp_path):
    m = build_model(build_config("bytes", "smoke"))
    m.run_config = build_config("bytes", "smoke")
    with pytest.raises(RltokError, match="flat baseline"):
        save_for_transformers(m, tmp_path / "x")
    with pytest.raises(RltokError, match="flat baseline"):
        to_transformers(m)


# -- without rltok: a clean subprocess -----------------------------------------------------------------

REMOTE = textwrap.dedent('''
    import importlib.abc, json, os, sys

    class NoRltok(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "rltok" or name.startswith("rltok."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoRltok())  # an editable install's finder comes after it
    sys.path[:] = [p for p in sys.path if p and not os.path.isfile(os.path.join(p, "rltok", "__init__.py"))]
    export, job, out_path = sys.argv[1:4]
    job = json.load(open(job))
    res = {}
    try:
        import rltok  # noqa: F401
        res["rltok_importable"] = True
    except ModuleNotFoundError:
        res["rltok_importable"] = False

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    cfg = AutoConfig.from_pretrained(export, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    res["classes"] = [type(x).__module__ for x in (cfg, model, tok)]
    enc = tok(job["texts"], padding=True, return_tensors="pt")
    res["input_ids"], res["attention_mask"] = enc.input_ids, enc.attention_mask
    with torch.no_grad():
        res["logits"] = model(**enc).logits
    res["greedy"] = model.generate(**enc, max_new_tokens=16)
    res["sampled"] = model.generate(**enc, max_new_tokens=16, do_sample=True, temperature=0.8, seed=5,
                                    boundary_mode="sample")
    res["decoded"] = tok.batch_decode(res["sampled"], skip_special_tokens=True)
    # transformers' own save_pretrained of the remote class carries the code on
    model.save_pretrained(os.path.join(os.getcwd(), "resaved"))
    again = AutoModelForCausalLM.from_pretrained(os.path.join(os.getcwd(), "resaved"), trust_remote_code=True)
    with torch.no_grad():
        res["resaved_logits"] = again(**enc).logits
    # the Hub path (offline, from a cache laid out as a download leaves it): transformers fetches
    # each code file it finds imported, and checks each one's imports are installed
    hub_model = AutoModelForCausalLM.from_pretrained(job["hub_repo"], trust_remote_code=True)
    hub_tok = AutoTokenizer.from_pretrained(job["hub_repo"], trust_remote_code=True)
    with torch.no_grad():
        res["hub_logits"] = hub_model(**hub_tok(job["texts"], padding=True, return_tensors="pt")).logits
    if job["piqa"]:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM

        lm = HFLM(pretrained=export, trust_remote_code=True, device="cpu", batch_size=4, dtype="float32")
        res["max_length"] = lm.max_length
        reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=j, metadata=("piqa", i, 1))
                for i, (c, x, j) in enumerate(job["piqa"])]
        res["piqa"] = lm.loglikelihood(reqs, disable_tqdm=True)
    res["rltok_modules"] = sorted(m for m in sys.modules if m == "rltok" or m.startswith("rltok."))
    torch.save(res, out_path)
''')


def _piqa_requests() -> list[tuple[str, str, int]]:
    if not (SHARED_DATA / "piqa" / "valid.jsonl").exists():
        return []
    try:
        import lm_eval.models.huggingface  # noqa: F401
    except ImportError:  # lm-eval, or its hf backend's accelerate, is missing
        return []
    from rltok.tasks import load_task

    items, _ = load_task("piqa", SHARED_DATA, limit=8)
    return [(it.context, c, j) for it in items for j, c in enumerate(it.choices)]


@pytest.fixture(scope="module")
def remote(export, tmp_path_factory):
    """Runs REMOTE in ``python -I`` from a directory outside the repository, with rltok refused."""
    work = tmp_path_factory.mktemp("remote")
    piqa = _piqa_requests()
    repo, commit = "someone/rltok-smoke", "0123456789abcdef0123456789abcdef01234567"
    cache = work / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(export, cache / "snapshots" / commit)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(commit)
    (work / "job.json").write_text(json.dumps({"texts": TEXTS, "piqa": piqa, "hub_repo": repo}))
    (work / "remote.py").write_text(REMOTE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(HF_MODULES_CACHE=str(work / "modules"), HF_HUB_CACHE=str(work / "hub"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    r = subprocess.run([sys.executable, "-I", str(work / "remote.py"), str(export), str(work / "job.json"),
                        str(work / "out.pt")], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return {**torch.load(work / "out.pt", weights_only=False), "piqa_requests": piqa}


def test_loads_where_rltok_is_not_importable(remote):
    assert remote["rltok_importable"] is False and remote["rltok_modules"] == []
    assert all(m.startswith("transformers_modules.") for m in remote["classes"])
    assert remote["input_ids"][0].tolist()[: len(TEXTS[0]) + 1] == _ids(TEXTS[0])


def test_remote_forward_and_generate_equal_rltok(remote, net):
    hf = to_transformers(net)
    ids, mask = remote["input_ids"], remote["attention_mask"]
    with torch.no_grad():
        torch.testing.assert_close(remote["logits"], hf(ids, attention_mask=mask).logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(remote["resaved_logits"], remote["logits"], atol=0, rtol=0)
    torch.testing.assert_close(remote["hub_logits"], remote["logits"], atol=0, rtol=0)
    prompts = [t.encode() for t in TEXTS]
    T = ids.shape[1]
    for key, kw in (("greedy", dict(temperature=0.0, boundary_mode="greedy", seed=0)),
                    ("sampled", dict(temperature=0.8, boundary_mode="sample", seed=5))):
        ref = generate(net, prompts, 16, dtype="fp32", **kw)
        got = [[x for x in row[T:].tolist() if x != PAD] for row in remote[key]]
        assert got == [g.sampled for g in ref], key
    assert remote["decoded"][0].startswith(TEXTS[0])


def test_lm_eval_hf_backend_scores_piqa_as_the_rltok_adapter(remote, net):
    if not remote["piqa_requests"]:
        pytest.skip("PIQA data (../shared/data/piqa) or lm-eval's hf backend not available")
    from lm_eval.api.instance import Instance

    from rltok.tasks.lm_eval_adapter import RltokLM

    assert remote["max_length"] == SEQ_LEN - 1  # max_position_embeddings: the scorer's window
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(c, x), idx=j, metadata=("piqa", i, 1))
            for i, (c, x, j) in enumerate(remote["piqa_requests"])]
    ref = RltokLM(model=net, greedy_boundaries=True, dtype="fp32", batch_size=16).loglikelihood(reqs, True)
    assert any(len(c.encode()) + len(x.encode()) + 1 > SEQ_LEN for c, x, _ in remote["piqa_requests"])
    assert len(remote["piqa"]) == len(ref) == len(reqs)
    for (ll, greedy), (ll_ref, greedy_ref) in zip(remote["piqa"], ref):
        assert ll == pytest.approx(ll_ref, abs=1e-4) and greedy == greedy_ref
