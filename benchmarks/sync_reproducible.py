"""A sync run twice with one seed: identical checkpoints? And what batch invariance costs.

For each of ``--repeats`` rounds, three `sao-gym train --set mode=sync` runs of
the same config and seed, each its own process: two with the default (a sync
run decodes each sequence alone, ``inference.batch_invariant`` null -> on) and
one with ``inference.batch_invariant=false`` (continuous batching, as an async
run samples). Reports, per round, how many tensors of the final checkpoint's learner state
(policy, critic, both optimizers) differ between the two default runs and
between a default run and the batched one, whether their per-step metrics
(timings aside) agree, and the training loop's trajectories per second of
each; ends with one JSON line (medians over rounds). ``--json PATH`` also writes
it with each run's steps/s and wall time, and how the script ran (``_record.py``).

Run (the demo recipe, its warm start cut short; other envs with ``--set``)::

    .venv/bin/python benchmarks/sync_reproducible.py --out runs/sync-repro \
        --json docs/data/sync_reproducible/demo.json
    .venv/bin/python benchmarks/sync_reproducible.py --out runs/sync-repro-ht \
        --set env=sao_gym/HeavyTail-v0 --set "env_kwargs={latency_median_s: 0.01}"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _record import write_record
from _runs import child_env, run_logged, say

TIMING = ("time/", "perf/", "learner/step_time_s", "learner/policy_time_s",
          "learner/critic_time_s")
DEFAULTS = ["mode=sync", "total_steps=10", "warm_start.steps=300",
            "eval.episodes=0"]


def train(run_dir: Path, sets: list[str]) -> dict:
    """One `sao-gym train` process; its final learner state, metrics and loop speed."""

    from sao_gym.learner.state import read_state
    from sao_gym.logging import read_metrics

    cmd = [str(Path(sys.executable).with_name("sao-gym")), "train", "--out", str(run_dir),
           *[a for kv in sets for a in ("--set", kv)]]
    run_logged(cmd, run_dir.with_suffix(".log"), child_env(None), f"training {run_dir.name}")
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    rows = read_metrics(run_dir)
    return {"state": read_state(last),
            "rows": [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows],
            "elapsed_s": rows[-1]["time/elapsed_s"], "steps": len(rows)}


def differing(a: dict, b: dict) -> tuple[int, int]:
    """(tensors that differ, tensors compared) over policy, critic and optimizers."""
    from sao_gym.utils import tensors

    parts = ("policy", "policy_opt", "critic", "critic_opt")
    ta, tb = ({k: s[k] for k in parts} for s in (a, b))
    return len(tensors.differing(ta, tb)), len(dict(tensors.tensors(ta)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the summary and every run's speed here")
    args = parser.parse_args()
    sets = [*DEFAULTS, f"seed={args.seed}", *args.set]
    rounds = []
    for rep in range(args.repeats):
        runs = {}
        for name, extra in (("a", []), ("b", []), ("batched", ["inference.batch_invariant=false"])):
            run_dir = args.out / f"r{rep}-{name}"
            if run_dir.exists():
                raise SystemExit(f"{run_dir} exists: pick another --out")
            say(f"round {rep}: {name} run")
            start = time.monotonic()
            runs[name] = train(run_dir, [*sets, *extra])
            runs[name]["wall_s"] = time.monotonic() - start
        same, total = differing(runs["a"]["state"], runs["b"]["state"])
        vs_batched, _ = differing(runs["a"]["state"], runs["batched"]["state"])
        speed = {n: r["steps"] / r["elapsed_s"] for n, r in runs.items()}
        row = {"tensors": total, "differ_a_b": same,
               "metrics_equal_a_b": runs["a"]["rows"] == runs["b"]["rows"],
               "differ_a_batched": vs_batched,
               "steps_per_s_invariant": statistics.median([speed["a"], speed["b"]]),
               "steps_per_s_batched": speed["batched"], "steps_per_s": speed,
               "wall_s": {n: round(r["wall_s"], 1) for n, r in runs.items()}}
        row["batched_over_invariant"] = row["steps_per_s_batched"] / row["steps_per_s_invariant"]
        say(json.dumps(row))
        rounds.append(row)
    summary = {k: statistics.median(r[k] for r in rounds) for k in
               ("steps_per_s_invariant", "steps_per_s_batched", "batched_over_invariant")}
    summary.update(rounds=rounds, all_identical=all(r["differ_a_b"] == 0 and r["metrics_equal_a_b"]
                                                    for r in rounds), config=sets)
    print(json.dumps(summary))
    if args.json:
        write_record(args.json, summary)


if __name__ == "__main__":
    main()
