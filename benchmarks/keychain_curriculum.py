"""KeyChain at a long horizon with the generic CPU recipe and its curriculum, seed by seed.

    python benchmarks/keychain_curriculum.py --hops 32 --seeds 0 1 2 3 4 \
        --out runs/c32 --archive docs/data/curriculum_keychain32

Each seed runs the command a user types, no config file::

    sao-gym train --set env=sao_gym/KeyChain-v0 --set "env_kwargs={hops: H}" --set seed=S

(the recipe's warm start climbs the declared hops 4, 8, 16, ... up to H, then
SAO trains at H, then 256 held-out episodes before and after RL). ``--parallel``
runs go side by side with ``--threads`` torch threads each (default: two runs of
one thread on a 2-core machine). Extra ``--set`` options pass through (and are
recorded). Each finished run's small files go to ``ARCHIVE/seed<S>/``: config,
evaluations, warm-start record, gzipped metrics, the command's output, wall time,
and how each played episode ended (``benchmarks/keychain_failures.py``'s classes)
for both evaluations and the kept training episodes. A seed whose archive is
there is skipped; ``benchmarks/report.py`` draws the tables from the archive.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _runs import child_env, keep_run, say
from keychain_failures import episodes

SPLITS = {"eval_before": "eval_before_episodes.json", "eval_after": "eval_after_episodes.json",
          "train": "train_episodes.json"}
"""Rollout-store split -> the archive file of its episodes' classes."""


def command(hops: int, seed: int, settings: list[str]) -> list[str]:
    """The ``sao-gym train`` arguments of one seed (without ``--out``)."""
    return ["sao-gym", "train", "--set", "env=sao_gym/KeyChain-v0",
            "--set", f"env_kwargs={{hops: {hops}}}", *[a for kv in settings for a in ("--set", kv)],
            "--set", f"seed={seed}"]


def run_one(out: Path, archive: Path, hops: int, seed: int, settings: list[str],
            threads: int) -> Path:
    """Train ``seed`` (unless archived already) and archive it; the archive directory."""
    kept = archive / f"seed{seed}"
    if (kept / "wall.json").exists():
        say(f"seed {seed}: archived already in {kept}")
        return kept
    run, log, timed = out / f"seed{seed}", out / f"seed{seed}.log", out / f"seed{seed}.wall"
    args = command(hops, seed, settings)
    if timed.exists() and (run / "eval_after.json").exists():  # trained; archiving failed
        wall = float(timed.read_text())
    else:
        shutil.rmtree(run, ignore_errors=True)
        log.unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        cmd = [str(Path(sys.executable).with_name("sao-gym")), *args[1:], "--out", str(run)]
        say(f"seed {seed}: {' '.join(args)} (log: {log})")
        started = time.monotonic()
        with log.open("w") as f:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                  env=child_env(threads), check=False)
        wall = time.monotonic() - started
        if done.returncode:
            raise RuntimeError(f"seed {seed} failed (exit {done.returncode}); see {log}")
        timed.write_text(f"{wall:.1f}\n")
    keep_run(run, kept, log, wall, f"OMP_NUM_THREADS={threads} " + " ".join(args))
    for split, name in SPLITS.items():
        (kept / name).write_text(json.dumps(episodes(run, split)) + "\n")
    return kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hops", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, required=True, help="run dirs land in OUT/seedS")
    p.add_argument("--archive", type=Path, required=True, help="kept files in ARCHIVE/seedS")
    p.add_argument("--parallel", type=int, default=2, help="runs side by side")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another setting for every run (e.g. total_steps=100)")
    args = p.parse_args(argv)
    if args.parallel < 1 or args.threads < 1:
        p.error("--parallel and --threads must be >= 1")
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = {seed: pool.submit(run_one, args.out, args.archive, args.hops, seed, args.set,
                                     args.threads) for seed in args.seeds}
        for seed, future in futures.items():
            kept = future.result()
            before, after = (json.loads((kept / f"eval_{w}.json").read_text())["success_rate"]
                             for w in ("before", "after"))
            wall = json.loads((kept / "wall.json").read_text())["wall_s"]
            say(f"seed {seed}: {before:.3f} -> {after:.3f} in {wall / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
