#!/usr/bin/env bash
# Issue 15's measurements: one rate-conditioned model against single-rate models, and the rates a
# one-sided penalty, a compute price and a curriculum settle at. tiny preset, built-in English,
# 3 MB each, seed 42, zero-initialised policy head, two runs side by side at one thread each.
# Usage: bash results/rates/run.sh [OUTDIR]   (resumable: a finished run is skipped)
# RLTOK="python -m rltok" with PYTHONPATH=<a frozen checkout> keeps edits of the tree out of the runs.
set -u
out=${1:-runs/rates}
mkdir -p "$out"
cat > "$out/jobs.txt" <<'JOBS'
fixed_r0.1 --set boundary.target_rate=0.1
fixed_r0.2
fixed_r0.3 --set boundary.target_rate=0.3
cond_0.1-0.3 --set boundary.rate_schedule=uniform:0.1:0.3
hinge_0.2 --set boundary.rate_loss=hinge
price_0.1 --set boundary.rate_weight=0 --set boundary.flop_price=0.1
price_0.5 --set boundary.rate_weight=0 --set boundary.flop_price=0.5
price_0.01 --set boundary.rate_weight=0 --set boundary.flop_price=0.01
price_0.03 --set boundary.rate_weight=0 --set boundary.flop_price=0.03
curriculum_0.4 --set boundary.rate_schedule=linear:0.4
JOBS
xargs -P 2 -L 1 -a "$out/jobs.txt" bash -c '
  name=$0; d='"$out"'/$name
  [ -f "$d/summary.json" ] || {
    if [ -d "$d" ]; then r=--resume; else r=; fi
    ${RLTOK:-rltok} train --method rl --preset tiny --data english --seed 42 --bytes 3M \
       --set boundary.init_scale=0 "$@" --threads 1 --no-progress --out "$d" $r >> "$d.log" 2>&1; }
  [ -f "$d.eval.json" ] || ${RLTOK:-rltok} eval "$d" --json > "$d.eval.json" 2> "$d.eval.err"
  case $name in cond_*) for r in 0.1 0.2 0.3; do
    [ -f "$d.eval_r$r.json" ] || ${RLTOK:-rltok} eval "$d" --rate $r --json > "$d.eval_r$r.json" 2> "$d.eval_r$r.err"; done;; esac'
