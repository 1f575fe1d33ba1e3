#!/bin/bash
# Commit the queue's finished records (tools/queue.sh): new prose-study cells (with the study's
# report, README block and windup trace regenerated) and new frontier points (with the frontier report), one
# commit whose message names each new record and its numbers. Run from anywhere; nothing to land:
# says so and exits 0.
cd "$(dirname "$0")/.." || exit 1
PY=.venv/bin/python
msg=""
if [ -n "$(git status --porcelain results/study-prose)" ]; then
  RLTOK_SHARED_DATA=../shared/data OMP_NUM_THREADS=1 $PY tools/study_prose.py report >/dev/null || exit 1
  # the controller's trace (issue 36: bounded over 32 MB, shown) from the runs' committed metrics
  OMP_NUM_THREADS=1 $PY results/study-prose/windup.py >/dev/null || exit 1
  git add results/study-prose README.md
  cells=$($PY - <<'PYEOF'
import json, subprocess, sys
sys.path.insert(0, "tools")
from study_prose import _no_rate  # the report's rule: a flat LM's rate is null or NaN
files = subprocess.run(["git", "diff", "--cached", "--name-only", "--diff-filter=A", "results/study-prose/cells"],
                       capture_output=True, text=True).stdout.split()
out = []
for f in files:
    c = json.load(open(f))
    t = c["test"]
    at = "" if _no_rate(t) else f" at rate {t['rate']:.3f}"
    out.append(f"{c['rung']} {c['tag']} s{c['seed']} (test {t['bpb']:.4f}{at}, C4 {c['c4']['bpb']:.4f})")
print("; ".join(out))
PYEOF
)
  msg="prose study: ${cells:-report regenerated}"
fi
if [ -n "$(git status --porcelain results/rates/frontier.json)" ]; then
  OMP_NUM_THREADS=1 $PY results/rates/frontier_report.py >/dev/null || exit 1
  OMP_NUM_THREADS=1 $PY results/rates/collect.py >/dev/null || exit 1  # results.json cells: the frontier rows too
  git add results/rates
  points=$($PY - <<'PYEOF'
import json, subprocess
old = json.loads(subprocess.run(["git", "show", "HEAD:results/rates/frontier.json"], capture_output=True, text=True).stdout)
new = json.load(open("results/rates/frontier.json"))
key = lambda r: (r["bytes"], r["tag"], r["seed"], r.get("requested_rate"))
seen = {key(r) for r in old["rows"]}
print("; ".join(f"{r['bytes']} {r['tag']} s{r['seed']}" + (f" at {r['requested_rate']}" if r.get("requested_rate") else "")
                + f": rate {r['rate']:.3f} bpb {r['bpb']:.4f} train FLOPs/byte {r['flops_per_byte_train'] / 1e6:.2f}M"
                for r in new["rows"] if key(r) not in seen))
PYEOF
)
  msg="$msg${msg:+; }frontier: $points"
fi
if [ -n "$msg" ]; then git commit -q -m "$msg" && git log --oneline -1; else echo "nothing to land"; fi
