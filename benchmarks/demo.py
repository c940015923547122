"""The embedded demo, seed by seed: wall time of `sao-gym train` and the RL gain by `sao-gym eval`.

For each seed: run `sao-gym train --out OUT/seedN --set seed=N` (the job
`make demo` runs; extra `--set` options pass through) as its own process and
time it, then evaluate with the `sao-gym eval` command, on the same episodes
(seeds from 1,000,000, never trained on) of the run's environment and options
at temperature 1:

- the warm-start checkpoint (`--model OUT/seedN/model/warm_start --env ...
  --env-kwargs ...`),
- the run's last checkpoint (`--run OUT/seedN`).

The gain is the second success rate minus the first. Prints a table, writes
comparison plots of all seeds (`sao-gym plot`) under OUT/plots, and ends
with one JSON line: per-seed numbers and the medians.

Run (on a quiet machine, seeds in sequence so each has the whole CPU)::

    .venv/bin/python benchmarks/demo.py --seeds 0 1 2 --out runs/demo-bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

SAO_GYM = str(Path(sys.executable).with_name("sao-gym"))


def sao_gym(*args: str) -> str:
    """Run the `sao-gym` command; its stdout (stderr passes through)."""
    done = subprocess.run([SAO_GYM, *args], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"sao-gym {' '.join(args)} failed with exit code {done.returncode}")
    return done.stdout


def evaluate(target: list[str], episodes: int) -> float:
    out = sao_gym("eval", *target, "--episodes", str(episodes), "--max-new-tokens", "24",
                  "--out", "/dev/null")
    return float(json.loads(out)["success_rate"])


def run_seed(seed: int, out: Path, overrides: list[str], episodes: int) -> dict:
    run_dir = out / f"seed{seed}"
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{run_dir} already holds a run: pick another --out")
    sets = [a for kv in [f"seed={seed}", *overrides] for a in ("--set", kv)]
    start = time.monotonic()
    sao_gym("train", "--out", str(run_dir), *sets)
    wall = time.monotonic() - start
    config = yaml.safe_load((run_dir / "config.yaml").read_text())  # the run's env and options
    warm = evaluate(["--model", str(run_dir / "model" / "warm_start"), "--env", config["env"],
                     "--env-kwargs", json.dumps(config["env_kwargs"])], episodes)
    final = evaluate(["--run", str(run_dir)], episodes)
    row = {"seed": seed, "train_wall_s": round(wall, 1), "warm_success": warm,
           "final_success": final, "gain": round(final - warm, 4)}
    print(f"seed {seed}: train {wall / 60:.1f} min, success {warm:.3f} (warm start) -> "
          f"{final:.3f} (after RL), gain {final - warm:+.3f}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, required=True, help="run dirs land in OUT/seedN")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to sao-gym train")
    p.add_argument("--episodes", type=int, default=256, help="evaluation episodes per model")
    args = p.parse_args(argv)
    rows = [run_seed(seed, args.out, args.set, args.episodes) for seed in args.seeds]
    runs = [str(args.out / f"seed{s}") for s in args.seeds]
    plots = sao_gym("plot", runs[0], *(["--compare", *runs[1:]] if len(runs) > 1 else []),
                    "--out", str(args.out / "plots"), "--smooth", "0.9").split()
    median = {k: statistics.median(r[k] for r in rows)
              for k in ("train_wall_s", "warm_success", "final_success", "gain")}
    print(f"median of {len(rows)}: train {median['train_wall_s'] / 60:.1f} min, success "
          f"{median['warm_success']:.3f} -> {median['final_success']:.3f}, "
          f"gain {median['gain']:+.3f}")
    for path in plots:
        print(f"plot: {path}")
    print(json.dumps({"runs": rows, "median": median, "plots": plots}))


if __name__ == "__main__":
    main()
