"""`sao-gym train` seed by seed (the demo, or any env): wall time and RL gain.

For each seed: run `sao-gym train --out OUT/seedN --set seed=N` (the job
`make demo` runs; extra `--set` options pass through) as its own process and
time it. The job itself evaluates the starting checkpoint (after its warm
start) and the trained one on the same held-out episodes (env seeds from
1,000,000, never trained on) at the sampling temperature, with the run's
environment options and turn limit: `OUT/seedN/eval_before.json` and
`eval_after.json`. The gain is the second success rate minus the first, with
its 95% interval. Prints a table, writes comparison plots of all seeds
(`sao-gym plot`) under OUT/plots, and ends with one JSON line: per-seed
numbers (the training loop's own seconds, ``loop_s``, beside the whole job's)
and the medians. ``--json PATH`` also writes that line and how the script ran
(``_record.py``).

Run (on a quiet machine, seeds in sequence so each has the whole CPU)::

    .venv/bin/python benchmarks/demo.py --seeds 0 1 2 3 4 --out runs/demo-bench \
        --json docs/data/demo_seeds01234/summary.json

With ``--set env=MODULE:ID`` it measures the generic CPU recipe on any
environment instead (``sao-gym train --set env=...`` with no config: the
env's oracle, turn limit and fitted budgets), the module on ``PYTHONPATH``::

    PYTHONPATH=path/to/my_envs .venv/bin/python benchmarks/demo.py --seeds 0 1 2 \
        --out runs/my-env --set env=my_envs:my/Env-v0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _record import write_record
from _runs import loop_seconds

SAO_GYM = str(Path(sys.executable).with_name("sao-gym"))


def sao_gym(*args: str) -> str:
    """Run the `sao-gym` command; its stdout (stderr passes through)."""
    done = subprocess.run([SAO_GYM, *args], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"sao-gym {' '.join(args)} failed with exit code {done.returncode}")
    return done.stdout


def run_seed(seed: int, out: Path, overrides: list[str]) -> dict:
    from sao_gym.evaluation import summary_gain
    from sao_gym.logging import read_metrics

    run_dir = out / f"seed{seed}"
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{run_dir} already holds a run: pick another --out")
    sets = [a for kv in [f"seed={seed}", *overrides] for a in ("--set", kv)]
    start = time.monotonic()
    sao_gym("train", "--out", str(run_dir), *sets)
    wall = time.monotonic() - start
    before, after = (json.loads((run_dir / f"eval_{w}.json").read_text())
                     for w in ("before", "after"))
    b, a = before["success_rate"], after["success_rate"]
    _, lo, hi = summary_gain(before, after)
    row = {"seed": seed, "train_wall_s": round(wall, 1),
           "loop_s": round(loop_seconds(read_metrics(run_dir)), 1), "start_success": b,
           "final_success": a, "gain": round(a - b, 4),
           "gain_interval": [round(lo, 4), round(hi, 4)], "episodes": after["episodes"]}
    print(f"seed {seed}: train {wall / 60:.1f} min, success {b:.3f} (warm start) -> "
          f"{a:.3f} (after RL), gain {100 * (a - b):+.1f} points "
          f"(95% interval {100 * lo:+.1f} to {100 * hi:+.1f})", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, required=True, help="run dirs land in OUT/seedN")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to sao-gym train")
    p.add_argument("--json", help="also write the summary (the last line) here")
    args = p.parse_args(argv)
    rows = [run_seed(seed, args.out, args.set) for seed in args.seeds]
    runs = [str(args.out / f"seed{s}") for s in args.seeds]
    plots = sao_gym("plot", runs[0], *(["--compare", *runs[1:]] if len(runs) > 1 else []),
                    "--out", str(args.out / "plots"), "--smooth", "0.9").split()
    median = {k: statistics.median(r[k] for r in rows)
              for k in ("train_wall_s", "start_success", "final_success", "gain")}
    print(f"median of {len(rows)}: train {median['train_wall_s'] / 60:.1f} min, success "
          f"{median['start_success']:.3f} -> {median['final_success']:.3f}, "
          f"gain {100 * median['gain']:+.1f} points; smallest gain "
          f"{100 * min(r['gain'] for r in rows):+.1f}, longest run "
          f"{max(r['train_wall_s'] for r in rows) / 60:.1f} min")
    for path in plots:
        print(f"plot: {path}")
    summary = {"runs": rows, "median": median, "plots": plots}
    print(json.dumps(summary))
    if args.json:
        write_record(args.json, {**summary, "overrides": args.set})


if __name__ == "__main__":
    main()
