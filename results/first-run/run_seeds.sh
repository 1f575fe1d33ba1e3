#!/usr/bin/env bash
# The seed study behind the README's first command (issue 17 item 2): the tiny preset on the
# built-in English corpus with the policy head zero-initialised (init_scale=0: 6 MB, the README
# command itself) and with the paper's initialisation (init_scale=1: 2 MB, enough to see which
# basin a seed falls into, which is settled in the first ~0.5 MB), five seeds each (42 = the
# default seed), two runs side by side at one thread each.
# Usage: bash results/first-run/run_seeds.sh [OUTDIR]   (resumable: a finished run is skipped)
# RLTOK="python -m rltok" with PYTHONPATH=<a frozen checkout> keeps edits of the working tree out of the runs.
set -u
out=${1:-runs/first-run}
mkdir -p "$out"
jobs=()
for s in 42 1 2 3 4; do jobs+=("0 $s 6M"); done
for s in 42 1 2 3 4; do jobs+=("1 $s 2M"); done
printf '%s\n' "${jobs[@]}" | xargs -P 2 -L 1 bash -c '
  init=$0; seed=$1; bytes=$2; d='"$out"'/init${init}_s${seed}
  [ -f "$d/summary.json" ] || {
    if [ -d "$d" ]; then r=--resume; else r=; fi
    ${RLTOK:-rltok} train --method rl --preset tiny --data english --seed $seed --bytes $bytes \
       --set boundary.init_scale=$init --threads 1 --no-progress --out "$d" $r >> "$d.log" 2>&1; }
  [ -f "$d.eval.json" ] || ${RLTOK:-rltok} eval "$d" --json > "$d.eval.json" 2> "$d.eval.err"'
