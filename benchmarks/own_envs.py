"""The generic CPU recipe on environments written outside the library, as a new user runs it.

    python benchmarks/own_envs.py --out runs/own-envs [--envs warehouse signup cash_machine] \
        [--seeds 0 1 2]

Each env of ``docs/data/own_envs/`` (a module that registers ``own/<Name>-v0``
with its oracle; none of them is in any recipe's tuning set), and docs/new_env.md's
own example (``examples/new_env.py``), is trained with the command a new user
types, no config file::

    PYTHONPATH=docs/data/own_envs sao-gym train --set env=MODULE:own/NAME-v0 --set seed=S

one run at a time with the whole machine, timed from the command's start to
its end (warm start, both evaluations and RL). Each finished run's small files
(config, warm-start record, evaluations, gzipped metrics, the command's output, the
wall time) are
kept in ``docs/data/own_envs/runs/<module>/seed<S>/``; ``benchmarks/report.py``
draws the results table from them. A run whose files are there is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _runs import keep_run

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "docs" / "data" / "own_envs"
IDS = {"warehouse": (ENVS, "own/Warehouse-v0", []),
       "signup": (ENVS, "own/Signup-v0", []),
       "cash_machine": (ENVS, "own/CashMachine-v0", []),
       "new_env": (ROOT / "examples", "examples/GuessNumber-v0", ["env_kwargs={high: 8}"])}
"""Module -> (its folder, the id it registers, the command's other settings). ``new_env`` is
docs/new_env.md's own example, trained with the command that page shows."""


def run_one(out: Path, module: str, seed: int) -> Path:
    """Train ``module``'s env on ``seed`` (unless kept already); the kept directory."""
    kept = ENVS / "runs" / module / f"seed{seed}"
    if (kept / "wall.json").exists():
        return kept
    run = out / module / f"seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    folder, env_id, settings = IDS[module]
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [str(Path(sys.executable).parent / "sao-gym"), "train",
           "--set", f"env={module}:{env_id}", *[a for kv in settings for a in ("--set", kv)],
           "--set", f"seed={seed}", "--out", str(run)]
    started = time.monotonic()
    with open(run.parent / f"seed{seed}.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}); see "
                           f"{run.parent / f'seed{seed}.log'}")
    keep_run(run, kept, run.parent / f"seed{seed}.log", wall, " ".join(
        [f"PYTHONPATH={folder.relative_to(ROOT)}", "sao-gym", *cmd[1:-2]]))
    return kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--envs", nargs="+", default=list(IDS), choices=list(IDS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args(argv)
    for module in args.envs:
        for seed in args.seeds:
            kept = run_one(args.out, module, seed)
            before = json.loads((kept / "eval_before.json").read_text())["success_rate"]
            after = json.loads((kept / "eval_after.json").read_text())["success_rate"]
            wall = json.loads((kept / "wall.json").read_text())["wall_s"]
            print(f"{module} seed {seed}: {before:.3f} -> {after:.3f} in {wall / 60:.1f} min",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
