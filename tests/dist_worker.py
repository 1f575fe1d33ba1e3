"""Run a list of training jobs inside one ``torchrun`` launch (used by test_distributed.py).

    torchrun --standalone --nproc_per_node=2 tests/dist_worker.py JOBS.json RESULTS.json

Each job: {"name", "method", "overrides": {...}, "out", "stop_at_step": int|null,
"resume": bool, "copy_from": run dir to copy to "out" first (rank 0) or null}. Rank 0 writes
{name: {"exit_code", "steps"}}; the process group is shut down in the gloo-safe order.
"""

import json
import shutil
import sys
import traceback

from rltok.config import build_config
from rltok.distributed import init_distributed, shutdown_and_exit
from rltok.train import train


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    info = init_distributed("cpu")
    results = {}
    code = 0
    try:
        for job in jobs:
            if job.get("copy_from"):
                if info.is_main:
                    shutil.copytree(job["copy_from"], job["out"])
                info.barrier()
            cfg = build_config(job["method"], "smoke", overrides=job["overrides"])
            res = train(cfg, job["out"], resume=job.get("resume", False), progress=False,
                        stop_at_step=job.get("stop_at_step"))
            results[job["name"]] = {"exit_code": res.exit_code, "steps": res.steps}
    except Exception:
        traceback.print_exc()
        code = 1
    if info.is_main:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
    shutdown_and_exit(info, code)


if __name__ == "__main__":
    main()
