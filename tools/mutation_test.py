"""Mutation testing of the estimator, the policy's loss and the objectives.

Each mutation is one deliberate bug (a sign, an index, a detach) written into a copy of the
package; the test run must fail on it. The run on the unmutated copy (the control) must pass.

    python tools/mutation_test.py            # the default test run against every mutation
    python tools/mutation_test.py --quick    # only the estimator/method test files (~1 min)
    python tools/mutation_test.py --only surrogate_sign,reward_sign --all-failures

It prints, per mutation, whether it was caught and by which test (the first failing one; with
``--all-failures`` every failing test) and writes the same as JSON with ``--json PATH``. Exit
status 1 if a mutation survived or the control failed.

Why a script and not mutmut: the mutations that matter here are semantic ("the reward-to-go
replaced by the advantage", "the log-probability of the other action") at specific call sites of
the training path; an operator-level tool mutates every operator of a file (hundreds of mutants,
each a full test run of minutes) and expresses none of these directly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    what: str


MUTATIONS = [
    Mutation("surrogate_sign", "rltok/estimator.py",
             "return -(returns.detach() * log_prob.float() * m).sum()",
             "return (returns.detach() * log_prob.float() * m).sum()",
             "the policy-gradient surrogate's sign"),
    Mutation("reward_sign", "rltok/boundaries/policy.py",
             "r = est.rewards(ctx.ce, ctx.ce_early, cfg.reward)",
             "r = -est.rewards(ctx.ce, ctx.ce_early, cfg.reward)",
             "the reward's sign, at the training path's call site"),
    Mutation("return_is_advantage", "rltok/boundaries/policy.py",
             "G = est.discounted_reward_to_go(adv, cfg.gamma, cfg.return_block)",
             "G = adv",
             "the reward-to-go replaced by the advantage itself"),
    Mutation("return_reversed", "rltok/boundaries/policy.py",
             "G = est.discounted_reward_to_go(adv, cfg.gamma, cfg.return_block)",
             "G = est.discounted_reward_to_go(adv.flip(-1), cfg.gamma, cfg.return_block).flip(-1)",
             "the reward-to-go reversed in time (rewards before t instead of after)"),
    Mutation("rate_penalty_sign", "rltok/estimator.py",
             "excess = pbar_g - target\n",
             "excess = target - pbar_g\n",
             "the rate penalty's sign"),
    Mutation("other_action_log_prob", "rltok/boundaries/policy.py",
             "log_prob = bernoulli_log_prob(b, logits) * decided",
             "log_prob = bernoulli_log_prob(~b, logits) * decided",
             "log pi(1 - b): the log-probability of the other action"),
    Mutation("early_head_detached", "rltok/objectives.py",
             "ce_e = per_position_ce(out.early_logits, batch.targets)",
             "ce_e = per_position_ce(out.early_logits.detach(), batch.targets)",
             "the early-exit head detached from its loss"),
    Mutation("return_direction_in_estimator", "rltok/estimator.py",
             "e = (i[None, :] - i[:, None]).double()",
             "e = (i[:, None] - i[None, :]).double()",
             "the blocked reward-to-go summing earlier positions (inside estimator.py)"),
    Mutation("baseline_sign", "rltok/estimator.py",
             "return ((rg - base) * mg).view(B, S)",
             "return ((rg + base) * mg).view(B, S)",
             "the batch-relative baseline added instead of subtracted"),
    Mutation("forced_end_at_batch_column", "rltok/model/chunking.py",
             "m.scatter_(1, last_valid(valid)[:, None], True)",
             "m[:, -1] = True",
             "the last boundary forced at the batch's last column, not the document's"),
    Mutation("uniform_claims_causal", "rltok/boundaries/fixed.py",
             "    causal = False\n",
             "    causal = True\n",
             "the exact-count uniform claiming causality"),
    Mutation("rate_penalty_ignores_requested_rate", "rltok/boundaries/policy.py",
             "                                          self.rate, ctx.reduce_mean, one_sided=",
             "                                          cfg.target_rate, ctx.reduce_mean, one_sided=",
             "a rate-conditioned policy's penalty steering to the fixed target, not the rate asked"),
    Mutation("warm_start_unweighted", "rltok/boundaries/policy.py",
             "            G = G * rho\n",
             "            G = G\n",
             "the off-policy warm start learning from behaviour samples without importance ratios"),
    Mutation("prescribed_decided", "rltok/boundaries/policy.py",
             "            b, decided = b | given, decided & ~given\n",
             "            b, decided = b | given, decided\n",
             "prescribed boundaries counted as the policy's decisions in the estimator"),
    Mutation("document_rate_uses_batch_rate", "rltok/boundaries/policy.py",
             'segments = est.document_segments(ctx.ids, BOS) if cfg.rate_scope != "batch" else None',
             "segments = None",
             "rate_scope=document falling back to the batch's rate controller"),
    Mutation("document_rate_wrong_segment", "rltok/estimator.py",
             "    within = torch.cumsum((ids == bos).long(), dim=1)\n",
             "    within = torch.cumsum((ids == bos).long(), dim=1) * 0\n",
             "document segments that ignore BOS (one segment per row)"),
    Mutation("hnet_control_sign", "rltok/boundaries/hnet.py",
             "self.threshold.add_(self.cfg.control_gain * (Fr.detach() - self.cfg.target_rate))",
             "self.threshold.add_(self.cfg.control_gain * (self.cfg.target_rate - Fr.detach()))",
             "H-Net's rate controller moving the threshold the wrong way"),
    Mutation("temperature_ignored", "rltok/data/languages.py",
             "    w = {k: (v / total) ** (1.0 / temperature) for k, v in byte_counts.items() if v > 0}",
             "    w = {k: (v / total) for k, v in byte_counts.items() if v > 0}",
             "temperature sampling that keeps the natural language shares"),
    Mutation("integral_controller_sign", "rltok/boundaries/policy.py",
             "step = cfg.rate_integral_gain * (achieved - self.rate)",
             "step = -cfg.rate_integral_gain * (achieved - self.rate)",
             "the policy's integral rate controller moving the logits the wrong way"),
    Mutation("rate_knob_sign", "rltok/boundaries/policy.py",
             "return self.rate_offset, 1.0, -20.0, 20.0",
             "return self.rate_offset, -1.0, -20.0, 20.0",
             "evaluation-time rate calibration moving the policy's offset the wrong way"),
    Mutation("rate_offset_ignored", "rltok/boundaries/policy.py",
             "return self.controller_offset() + self.prior_logit",
             "return self.prior_logit + 0.0 * self.controller_offset()",
             "the policy's logits deaf to its offset (no controller, no calibration)"),
    Mutation("inner_reward_sign", "rltok/objectives.py",
             "            c, c_skip, targets = chunk_sums(c, ch), chunk_sums(c_skip, ch), chunk_sums(targets, ch)",
             "            c_skip, c, targets = chunk_sums(c, ch), chunk_sums(c_skip, ch), chunk_sums(targets, ch)",
             "deeper levels: a router's reward with its sign flipped"),
    Mutation("inner_uniform_not_rescaled", "rltok/model/stage.py",
             "    return (u / p.float().clamp(min=1e-30)).clamp(max=1 - 2 ** -24)",
             "    return u",
             "two stages: the inner router drawing from the outer's uniform as it is (not uniform)"),
    Mutation("inner_credit_last_byte_only", "rltok/model/stage.py",
             "return torch.zeros(B, M, dtype=x.dtype, device=x.device).scatter_add(1, chunks.up, x)",
             "return x.gather(1, chunks.positions)",
             "two stages: an outer chunk credited with its last byte's loss, not its bytes'"),
    Mutation("antiwindup_ignored", "rltok/boundaries/policy.py",
             "            probs = self._network_probs(out.logits)",
             "            probs = out.probs",
             "anti-windup: the rate penalty sees the held rate, not the network's own"),
    Mutation("dtype_choice_inverted", "rltok/precision.py",
             '    chosen = "bf16" if bf16 >= BF16_MARGIN * fp32 else "fp32"',
             '    chosen = "fp32" if bf16 >= BF16_MARGIN * fp32 else "bf16"',
             "train.dtype=auto picks the slower dtype"),
    Mutation("step_ignores_dtype", "rltok/train.py",
             "        self.amp = autocast_for(info.device, self.dtype.dtype, cfg.model.d_model)",
             '        self.amp = autocast_for(info.device, "fp32", cfg.model.d_model)',
             "the training step computes in fp32 whatever dtype was chosen and reported"),
    Mutation("sync_in_loss", "rltok/objectives.py",
             "    lm, early = ce.sum() / n, ce_e.sum() / n\n",
             "    lm, early = ce.sum() / n, ce_e.sum() / n\n    assert float(lm) == float(lm)\n",
             "a host sync added to the training loss (it stalls a GPU every micro-step)"),
    Mutation("gamma_from_host", "rltok/estimator.py",
             "        g = float(gamma)",
             "        g = torch.tensor(gamma, dtype=torch.float64, device=dev)",
             "a tensor made from host data on the device in the return (a blocking copy on a GPU)"),
    Mutation("content_goal_inverted", "rltok/estimator.py",
             "            goal = per_nat * info / den.clamp(min=1)",
             "            goal = per_nat * den / info.clamp(min=1e-9)",
             "rate_scope=content asks a document for boundaries against its information, not with it"),
    Mutation("price_sign", "rltok/boundaries/policy.py",
             "            G = G + est.batch_relative(-cost, mask, cfg.baseline, cfg.baseline_group, reducer)",
             "            G = G + est.batch_relative(cost, mask, cfg.baseline, cfg.baseline_group, reducer)",
             "the compute price in the reward pays the policy for boundaries instead of charging it"),
    Mutation("entropy_unshifted", "rltok/boundaries/entropy.py",
             "    return F.pad(H[:, :-1], (1, 0))",
             "    return H",
             "entropy patching reads the prediction of the byte after t at t (one byte of the future)"),
    Mutation("entropy_flops_trained", "rltok/flops.py",
             "    per_byte = _matmul_params([*top.encoder, *top.decoder, *heads, top.router]) - _matmul_params(frozen)",
             "    per_byte = _matmul_params([*top.encoder, *top.decoder, *heads, top.router])",
             "the FLOP count trains the frozen entropy model on every byte (3x its forward cost)"),
    Mutation("rate_knots_swapped", "rltok/boundaries/policy.py",
             "        return [(k, 1.0 - (x - k)), (k + 1, x - k)]",
             "        return [(k, x - k), (k + 1, 1.0 - (x - k))]",
             "the offset curve interpolates toward the far knot (the request drifts off its rate)"),
    Mutation("stage_skip_level", "rltok/model/stage.py",
             "                below = [inner.h if self.inner._wants_skip() else None] + inner.skips",
             "                below = [inner.y if self.inner._wants_skip() else None] + inner.skips",
             "the skip exit's baseline takes the level's own output: it skips nothing"),
    Mutation("rate_match_weight_sign", "rltok/evaluate.py",
             "    w = (target - a.rate) / (b.rate - a.rate)",
             "    w = (a.rate - target) / (b.rate - a.rate)",
             "a scored set is read at the rate mirrored about its first point, not at the target"),
]

QUICK_TESTS = ["tests/test_estimator.py", "tests/test_estimator_training_path.py",
               "tests/test_methods.py", "tests/test_causality.py", "tests/test_batch_invariance.py",
               "tests/test_rates.py", "tests/test_policy_options.py", "tests/test_languages.py",
               "tests/test_two_stage.py", "tests/test_precision.py", "tests/test_static_chunks.py",
               "tests/test_golden_stages.py", "tests/test_stages.py", "tests/test_entropy.py"]


def copy_tree(dst: Path) -> None:
    """The checkout's files (tracked, and untracked ones git does not ignore), as the tests see
    them in a clone."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = REPO / rel
        if not src.is_file() or rel.startswith("results/"):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)


def apply(root: Path, m: Mutation) -> None:
    p = root / m.path
    src = p.read_text()
    n = src.count(m.old)
    if n != 1:
        raise SystemExit(f"mutation {m.name}: expected the text once in {m.path}, found it {n} times "
                         f"(the code moved: update tools/mutation_test.py)")
    p.write_text(src.replace(m.old, m.new))


def run_tests(root: Path, tests: list[str], stop_first: bool, timeout: float) -> tuple[int, list[str], float]:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    env.setdefault("RLTOK_SHARED", str(REPO.parent / "shared"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests]
    if stop_first:
        cmd.insert(3, "-x")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, ["(timeout)"], time.time() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
    if proc.returncode != 0 and not failed:  # collection error, crash
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        failed = ["(error) " + " | ".join(tail)]
    return proc.returncode, failed, time.time() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="run only the estimator/method test files")
    ap.add_argument("--only", default="", help="comma-separated mutation names (default: all)")
    ap.add_argument("--all-failures", action="store_true", help="do not stop at the first failing test")
    ap.add_argument("--json", default="", help="write the results to this JSON file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per test run (default: 1800)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = ap.parse_args(argv)
    muts = MUTATIONS
    if args.list:
        for m in muts:
            print(f"{m.name:32s} {m.path}: {m.what}")
        return 0
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {m.name for m in muts}
        if unknown:
            print(f"--only: unknown mutation(s) {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
            return 2
        muts = [m for m in muts if m.name in names]
    tests = QUICK_TESTS if args.quick else []  # [] = the default test run (pyproject's testpaths)
    stop = not args.all_failures
    results = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="rltok-mut-") as tmp:
        for m in [None, *muts]:
            root = Path(tmp) / (m.name if m else "control")
            copy_tree(root)
            if m:
                apply(root, m)
            rc, failed, secs = run_tests(root, tests, stop, args.timeout)
            name = m.name if m else "control"
            caught = rc != 0
            good = caught if m else rc == 0
            ok &= good
            results.append({"mutation": name, "what": m.what if m else "no mutation", "caught": caught,
                            "exit": rc, "failing_tests": failed, "seconds": round(secs, 1)})
            status = ("CAUGHT" if caught else "SURVIVED") if m else ("pass" if rc == 0 else "FAILED")
            first = failed[0] if failed else ""
            print(f"{name:32s} {status:8s} {secs:6.0f}s  {first}", flush=True)
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"tests": "quick" if args.quick else "default run",
                                               "results": results}, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
