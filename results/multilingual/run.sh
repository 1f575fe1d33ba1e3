#!/usr/bin/env bash
# Issue 16's training runs: the tiny preset on the built-in multilingual corpus (27 languages,
# temperature sampling T = 2), 4 MB each, two runs side by side at one thread each.
#   rl (3 seeds), rl with one rate controller per document (3 seeds), BPE guidance (3 seeds),
#   uniform and H-Net (1 seed each).
# Usage: bash results/multilingual/run.sh [OUTDIR]   (resumable: a finished run is skipped)
# Then: python tools/multilingual_study.py measure OUTDIR && python tools/multilingual_study.py report
# RLTOK="python -m rltok" with PYTHONPATH=<a frozen checkout> keeps edits of the working tree out of the runs.
set -u
out=${1:-runs/multilingual}
mkdir -p "$out"
jobs=()
for s in 42 1 2; do jobs+=("rl $s -" "rl-doc $s boundary.rate_scope=document" "bpe $s -"); done
jobs+=("uniform 42 -" "hnet 42 -")
printf '%s\n' "${jobs[@]}" | xargs -P 2 -L 1 bash -c '
  name=$0; seed=$1; extra=$2; method=${name%-doc}; d='"$out"'/${name}_s${seed}
  set=(); [ "$extra" = - ] || set=(--set "$extra")
  # the BPE seeds share one tokenizer: the one the first BPE run fitted, where it exists
  tok='"$out"'/bpe_s42/tokenizer.json
  [ $name = bpe ] && [ $seed != 42 ] && [ -f "$tok" ] && set=(--set boundary.tokenizer=$tok)
  [ -f "$d/summary.json" ] || {
    if [ -d "$d" ]; then r=--resume; else r=; fi
    ${RLTOK:-rltok} train --method $method --preset tiny --data multilingual --seed $seed --bytes 4M \
       --set data.language_temperature=2 --set data.test_docs=256 "${set[@]}" \
       --threads 1 --no-progress --out "$d" $r >> "$d.log" 2>&1; }'
