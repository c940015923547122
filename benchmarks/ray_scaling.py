"""Training throughput on Ray with 1, 2 and 4 rollout workers, and the Ray path's overhead.

Environment: ``sao_gym/HeavyTail-v0`` (lognormal step latency, median 1 s,
and episode length, median 2 turns: the environment's latency dominates, as
in sandbox-heavy agentic work). Every run trains the demo's tiny model for the same number of
trajectories (``--steps`` x ``--batch``), each worker running
``--episodes-per-worker`` episodes at once, so N workers run N times the
episodes. One local Ray instance (on 127.0.0.1) serves every Ray run; the
same config with ``runtime: local`` and ``rollout.concurrency`` equal to 2
workers' episodes is the single-process trainer at equal concurrency.
Throughput: trajectories per second of the training loop (actor and model
start-up excluded). Runs alternate (``--repeats``), medians are reported.

Run: .venv/bin/python benchmarks/ray_scaling.py --repeats 3 --json docs/data/ray_scaling/seed0.json
Last line: one JSON object with every number; ``--json PATH`` also writes it with
the settings and how the script ran (``_record.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from _record import write_record

BASE = [
    "env=sao_gym/HeavyTail-v0",
    "env_kwargs={latency_median_s: 1.0, latency_sigma: 0.5, turns_median: 2.0, turns_sigma: 0.5,"
    " max_turns: 6}",
    "rollout.max_new_tokens=8", "rollout.max_context_tokens=384",
    "rollout.max_staleness=4", "learner.critic_warmup_steps=0", "learner.lr=1e-5",
    "checkpoint.every=0", "eval.episodes=0", "warm_start=null", "inference.max_batch_size=16",
]


def run_once(config, run_dir: Path, model: str) -> float:
    from sao_gym.runtime.config.build import build_trainer

    trainer = build_trainer(config, run_dir, policy_path=model)
    trainer.run()
    return config.total_steps * config.rollout.batch_size / trainer.loop_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--episodes-per-worker", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--json", help="also write every run and the settings here")
    args = parser.parse_args()

    from sao_gym.models import tiny_model
    from sao_gym.runtime.config.loader import load_config, load_recipe
    from sao_gym.runtime.place.ray.cluster import connect

    root = Path(args.out or tempfile.mkdtemp(prefix="sao-ray-scaling-"))
    model = tiny_model(str(root / "model"), seed=0, **load_recipe("demo").model_options)
    epw = args.episodes_per_worker
    base = load_config(None, [*BASE, f"total_steps={args.steps}",
                              f"rollout.batch_size={args.batch}", *args.set])
    connect(None, num_cpus=max(8, 2 * max(args.workers) + 2))
    runs: dict[str, list[float]] = {f"ray_{n}": [] for n in args.workers}
    runs["local_equal_to_ray_2"] = []
    for rep in range(args.repeats):
        for n in args.workers:
            cfg = dataclasses.replace(base, runtime="ray", ray=dataclasses.replace(
                base.ray, rollout_workers=n, episodes_per_worker=epw))
            runs[f"ray_{n}"].append(run_once(cfg, root / f"ray{n}-{rep}", model))
            print(f"ray, {n} workers: {runs[f'ray_{n}'][-1]:.2f} trajectories/s", flush=True)
        cfg = dataclasses.replace(base, runtime="local", rollout=dataclasses.replace(
            base.rollout, concurrency=2 * epw))
        runs["local_equal_to_ray_2"].append(run_once(cfg, root / f"local-{rep}", model))
        print(f"local, {2 * epw} episodes: {runs['local_equal_to_ray_2'][-1]:.2f} "
              "trajectories/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {"trajectories_per_s": med, "runs": runs,
              "speedup_1_to_2": med.get("ray_2", 0) / med["ray_1"] if "ray_1" in med else None,
              "speedup_1_to_4": med.get("ray_4", 0) / med["ray_1"] if "ray_1" in med else None,
              "ray_overhead_vs_local": (1 - med["ray_2"] / med["local_equal_to_ray_2"]
                                        if "ray_2" in med else None),
              "episodes_per_worker": epw, "trajectories": args.steps * args.batch}
    print(json.dumps(result))
    if args.json:
        write_record(args.json, {**result, "settings": {
            "workers": args.workers, "steps": args.steps, "batch": args.batch,
            "repeats": args.repeats, "overrides": [*BASE, *args.set],
            "seed": base.seed, "learner_threads": base.ray.learner_threads}})


if __name__ == "__main__":
    main()
