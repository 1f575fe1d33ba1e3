#!/usr/bin/env bash
# The long studies, queued on a 2-core machine, each from a worktree frozen at this checkout's
# commit (editing the checkout never changes a running study), results written into this checkout:
#   1. issue 39's FLORES study (results/multilingual/run_flores.sh) on both cores, JOBS=2;
#   2. then, one core each: issue 36's prose study (tools/study_prose.py run, 8 and 32 MB, in its
#      TIERS order) beside issue 38's frontier (results/rates/frontier.py: rl at 2 MB, then every row
#      at 8 MB, then rl at 0.05 at 2 and 8 MB; 3 seeds); then that core runs prose cells too (the
#      open issue's 32 MB rung comes before the frontier's budget trend), and once the prose study
#      is done, the frontier's last leg: rl at every rate at 32 MB.
# Everything is resumable: a finished run or cell is skipped, a stopped one resumes from its last
# checkpoint. Commit the records as they land (git status results/).
#
#   bash tools/queue.sh start    # freeze (or refreeze) the worktree and start the queue in the background
#   bash tools/queue.sh status   # what runs now, what is recorded
#   bash tools/queue.sh stop     # stop everything (checkpoints are kept)
#
# Needs: .venv with rltok installed (README), ../shared/data, `rltok data fetch-evals` done once
# (GPT-NeoX's tokenizer for the study's bpe-lm-neox row). FROZEN (default ../rltok-frozen) is the
# worktree; LOGS (default runs/queue) the logs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FROZEN=${FROZEN:-$(dirname "$ROOT")/rltok-frozen}
LOGS=${LOGS:-$ROOT/runs/queue}
PY=$ROOT/.venv/bin/python
SHARED=${RLTOK_SHARED_DATA:-$(dirname "$ROOT")/shared/data}
flores_records() { ls "$ROOT"/results/multilingual/measure-8M/[!_]*_s*.json 2>/dev/null | wc -l; }

case "${1:-status}" in
start)
  [ -x "$PY" ] || { echo "queue: $PY missing: install rltok first (README)"; exit 1; }
  [ -d "$SHARED" ] || { echo "queue: $SHARED missing: the studies read ../shared/data"; exit 1; }
  if pgrep -f "tools/queue.sh run" >/dev/null; then echo "queue: already running (bash tools/queue.sh status)"; exit 1; fi
  commit=$(git -C "$ROOT" rev-parse HEAD)
  if [ -d "$FROZEN" ]; then git -C "$FROZEN" checkout -q --detach "$commit"
  else git -C "$ROOT" worktree add -q --detach "$FROZEN" "$commit"; fi
  mkdir -p "$LOGS"
  echo "queue: worktree $FROZEN at $(git -C "$FROZEN" log --oneline -1 | cut -c1-60)"
  setsid nohup bash "$0" run >> "$LOGS/queue.log" 2>&1 < /dev/null &
  echo "queue: started (logs in $LOGS)"
  ;;
run)  # the queue itself (start runs it in the background)
  cd "$FROZEN"
  export RLTOK_SHARED_DATA=$SHARED PYTHONPATH=$FROZEN OMP_NUM_THREADS=1 \
         RLTOK_STUDY_RESULTS=$ROOT/results/study-prose RLTOK_STUDY_RUNS=$ROOT/runs/study-prose
  # the FLORES study's runs are skipped by their run directories, which a fresh machine lacks:
  # once all 18 records exist it is done and is not retrained
  if [ "$(flores_records)" -lt 18 ]; then
    echo "$(date -u +%FT%TZ) FLORES study (2 jobs)"
    JOBS=2 ML_RESULTS=$ROOT/results/multilingual RLTOK="$PY -m rltok" PYTHON=$PY \
      bash results/multilingual/run_flores.sh "$ROOT/runs/multilingual-flores" >> "$LOGS/multilingual.log" 2>&1 || true
  fi
  echo "$(date -u +%FT%TZ) prose study and rate frontier (1 job each)"
  "$PY" tools/study_prose.py run --rungs 8M,32M --jobs 1 >> "$LOGS/study-prose.log" 2>&1 &
  # the frontier: first rl at each rate at 2 MB (an hour; the first point of "the best rate vs
  # budget"), then every row at 8 MB, then rl at 0.05 at 2 and 8 MB (at equal compute the best rate
  # was the lowest asked, 0.1: the trend needs a point past it). Then this core joins the prose
  # study, a second runner over the same plan (a cell the first runner holds is locked and skipped,
  # a finished one is skipped): issue 36 is open and its 32 MB rung needs both cores. Last, rl at
  # each rate at 32 MB (the budget trend's last point; rl at 0.2 there is the prose study's cell).
  frontier() {  # shellcheck disable=SC2086
    "$PY" results/rates/frontier.py $1 --seeds 1,2,3 --out "$ROOT/runs/frontier" \
      --record "$ROOT/results/rates/frontier.json" >> "$LOGS/frontier.log" 2>&1 || true; }
  ( for args in "--bytes 2M --rows rl" "--bytes 8M --prices 0.07" "--bytes 2M,8M --rows rl --rates 0.05"; do
      frontier "$args"; done
    echo "$(date -u +%FT%TZ) frontier to 8 MB done: its core joins the prose study" >> "$LOGS/frontier.log"
    "$PY" tools/study_prose.py run --rungs 8M,32M --jobs 1 >> "$LOGS/study-prose-2.log" 2>&1 || true
    frontier "--bytes 32M --rows rl --rates 0.05,0.1,0.15,0.2,0.3,0.4"
  ) &
  wait
  echo "$(date -u +%FT%TZ) queue done"
  ;;
status)
  pgrep -fa "rltok train|study_prose.py cell|multilingual_study.py|frontier.py" | cut -c1-160 || echo "queue: nothing running"
  echo "FLORES records: $(flores_records) of 18"
  echo "prose cells: $(ls "$ROOT"/results/study-prose/cells/*/*.json 2>/dev/null | wc -l)"
  [ -f "$ROOT/results/rates/frontier.json" ] && echo "frontier points: $("$PY" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['rows']))" "$ROOT/results/rates/frontier.json" 2>/dev/null || echo '?')"
  ;;
stop)
  pkill -f "tools/queue.sh run" || true
  pkill -f "run_flores.sh|study_prose.py|frontier.py|multilingual_study.py" || true
  pkill -f "rltok train" || true  # a stopped training writes its checkpoint on SIGTERM
  echo "queue: stopped"
  ;;
*) echo "usage: bash tools/queue.sh start|status|stop"; exit 2 ;;
esac
