"""``sao-gym bench async-vs-sync``: training throughput of the two modes.

Both modes train the same model on the same environment for the same number
of trajectories (``steps * batch_size``), with the same parallelism
(``concurrency``), one after the other in one process. The default
configuration is the ``bench`` recipe (``sao_gym/recipes/bench.yaml``): its
environment has lognormal step latencies and episode lengths, as agentic
tasks do: in sync mode every batch waits for its
slowest episode and generation stops while the learner trains; in async
mode finished episodes train as soon as a batch is in and generation never
stops. Throughput is trajectories trained per second of the training loop
(model building excluded). Both modes batch their sampling the same way: a
null ``inference.batch_invariant`` (on for a sync run, to make it
reproducible) is off here, so the ratio measures the scheduling only.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from sao_gym.runtime.config import TrainConfig
from sao_gym.runtime.loader import load_recipe


def async_vs_sync(overrides: list[str] = (), *, repeats: int = 1,
                  work_dir: str | None = None) -> dict[str, Any]:
    """Train in both modes ``repeats`` times (alternating); return throughputs and ratio."""
    from sao_gym.models import tiny_model
    from sao_gym.runtime.job import build_trainer

    base: TrainConfig = load_recipe("bench", overrides)
    if getattr(base.inference, "batch_invariant", False) is None:
        base = dataclasses.replace(base, inference=dataclasses.replace(
            base.inference, batch_invariant=False))
    root = Path(work_dir or tempfile.mkdtemp(prefix="sao-bench-"))
    model = tiny_model(str(root / "model"), seed=base.seed)
    runs: dict[str, list[float]] = {"async": [], "sync": []}
    for rep in range(repeats):
        for mode in ("sync", "async"):
            staleness = 0 if mode == "sync" else max(base.rollout.max_staleness, 1)
            cfg = dataclasses.replace(base, rollout=dataclasses.replace(
                base.rollout, max_staleness=staleness))
            trainer = build_trainer(cfg, root / f"{mode}-{rep}", policy_path=model)
            trainer.run()
            runs[mode].append(cfg.total_steps * cfg.rollout.batch_size / trainer.loop_seconds)
    med = {m: sorted(v)[len(v) // 2] for m, v in runs.items()}
    return {
        "async_trajectories_per_s": med["async"],
        "sync_trajectories_per_s": med["sync"],
        "ratio": med["async"] / med["sync"],
        "runs": runs,
        "trajectories": base.total_steps * base.rollout.batch_size,
        "config": {k: v for k, v in base.to_dict().items() if k != "learner"},
    }
