#!/usr/bin/env bash
# Issue 39's training runs: the tiny preset on the built-in multilingual corpus at T = 2, 8 MB each,
# seeds 42, 1, 2, two runs side by side at one thread each (JOBS=1: one at a time):
#   rl (the paper's batch rate penalty), rl-doc (one controller per document), rl-content
#   (boundaries in proportion to each document's information, boundary.rate_scope=content),
#   entropy (BLT's entropy patching), bpe (BPE guidance, its BPE fitted on the same T = 2 text at
#   r*; the seeds share the first run's tokenizer) and uniform.
# Usage: bash results/multilingual/run_flores.sh [OUTDIR]   (resumable: a finished run is skipped;
#        ML_RESULTS=DIR writes the measurements under DIR/measure-8M, e.g. the main checkout's results/multilingual)
# Each run is measured as soon as it has trained (MEASURE=0 skips it); or later:
#       python tools/multilingual_study.py measure OUTDIR --into measure-8M   (FLORES-200: each rate knob calibrated
#       on sentences 0-505 of the training languages, all 204 languages scored on 506-1011)
#       python tools/multilingual_study.py flores-tokenizers OUTDIR --into measure-8M
#       python tools/multilingual_study.py bpe-sweep OUTDIR   # the same-data BPE at other vocabulary sizes (~4 min)
#       python tools/multilingual_study.py report
# RLTOK="python -m rltok" with PYTHONPATH=<a frozen checkout> keeps edits of the working tree out of the runs.
set -u
out=${1:-runs/multilingual-flores}
mkdir -p "$out"
jobs=()
for s in 42 1 2; do
  jobs+=("rl $s -" "rl-doc $s boundary.rate_scope=document" "rl-content $s boundary.rate_scope=content"
         "entropy $s -" "bpe $s -" "uniform $s -")
done
printf '%s\n' "${jobs[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c '
  name=$0; seed=$1; extra=$2; method=${name%-doc}; method=${method%-content}; d='"$out"'/${name}_s${seed}
  set=(); [ "$extra" = - ] || set=(--set "$extra")
  tok='"$out"'/bpe_s42/tokenizer.json
  [ $name = bpe ] && [ $seed != 42 ] && [ -f "$tok" ] && set=(--set boundary.tokenizer=$tok)
  [ -f "$d/summary.json" ] || {
    if [ -d "$d" ]; then r=--resume; else r=; fi
    ${RLTOK:-rltok} train --method $method --preset tiny --data multilingual --seed $seed --bytes 8M \
       --set data.language_temperature=2 --set data.test_docs=256 "${set[@]}" \
       --threads 1 --no-progress --out "$d" $r >> "$d.log" 2>&1; }
  # measured at once (FLORES, UDHR, Reference): its record in results/multilingual/measure/ outlives
  # the run folder, which a new session does not have
  [ "${MEASURE:-1}" = 1 ] && [ -f "$d/summary.json" ] && \
    ${PYTHON:-python} tools/multilingual_study.py ${ML_RESULTS:+--results $ML_RESULTS} measure '"$out"' --into measure-8M --only ${name}_s${seed} >> "$d.log" 2>&1'
