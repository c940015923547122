"""The staleness bound under load: ``async/staleness_max`` never above ``rollout.max_staleness``.

For each bound K of ``--bounds``, one `sao-gym train` process (its own, one after
the other) on ``sao_gym/HeavyTail-v0`` (lognormal latencies), the demo's tiny
model, no warm start, 32 episodes at once, batch 8, ``--steps`` learner steps;
then from its metrics.jsonl: the lines, the largest ``async/staleness_max``, the
lines at the bound (the run really is asynchronous), the mean of
``async/staleness_mean`` and the training loop's seconds. Exits 1 when a line
is over its bound. ``--json PATH`` writes every line's staleness too, and how the
script ran (``_record.py``).

Run::

    .venv/bin/python benchmarks/staleness_bound.py --out runs/staleness \
        --json docs/data/staleness_bound.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _record import write_record
from _runs import child_env, loop_seconds, run_logged, say

SETS = ["env=sao_gym/HeavyTail-v0", "env_kwargs={}", "warm_start=null", "eval.episodes=0",
        "rollout.concurrency=32", "rollout.batch_size=8", "rollout.max_new_tokens=8",
        "checkpoint.every=0"]
SUMMARY = ("bound", "lines", "staleness_max", "lines_at_bound", "lines_over_bound",
           "staleness_mean", "loop_s")


def run_bound(bound: int, steps: int, run_dir: Path) -> dict:
    """One training run at bound ``bound``; its staleness line by line and the summary."""
    from sao_gym.logging import read_metrics

    sets = [*SETS, f"rollout.max_staleness={bound}", f"total_steps={steps}"]
    cmd = [str(Path(sys.executable).with_name("sao-gym")), "train", "--out", str(run_dir),
           *[a for kv in sets for a in ("--set", kv)]]
    run_logged(cmd, run_dir.with_suffix(".log"), child_env(None), f"the run at K={bound}")
    rows = read_metrics(run_dir)
    worst = [r["async/staleness_max"] for r in rows]
    mean = [r["async/staleness_mean"] for r in rows]
    return {"bound": bound, "lines": len(rows), "staleness_max": max(worst),
            "lines_at_bound": sum(w == bound for w in worst),
            "lines_over_bound": sum(w > bound for w in worst),
            "staleness_mean": statistics.mean(mean), "loop_s": round(loop_seconds(rows), 1),
            "staleness_max_by_line": worst, "staleness_mean_by_line": mean, "overrides": sets}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="run dirs land in OUT/kK")
    p.add_argument("--bounds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    runs = []
    for bound in args.bounds:
        run_dir = args.out / f"k{bound}"
        if run_dir.exists():
            raise SystemExit(f"{run_dir} exists: pick another --out")
        say(f"K={bound}: {args.steps} steps")
        runs.append(run_bound(bound, args.steps, run_dir))
        say(json.dumps({k: runs[-1][k] for k in SUMMARY}))
    if args.json:
        write_record(args.json, {"steps": args.steps, "runs": runs})
    if any(r["lines_over_bound"] for r in runs):
        raise SystemExit("a line is over its staleness bound")


if __name__ == "__main__":
    main()
