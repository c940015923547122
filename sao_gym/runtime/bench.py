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

import tempfile
from pathlib import Path
from typing import Any

from sao_gym.runtime.config.build import build_trainer, run_parts
from sao_gym.runtime.config.loader import load_recipe


def async_vs_sync(overrides: list[str] = (), *, repeats: int = 1,
                  work_dir: str | None = None) -> dict[str, Any]:
    """Train in both modes ``repeats`` times (alternating); return throughputs and ratio."""
    from sao_gym.models import tiny_model

    overrides = list(overrides)
    base = load_recipe("bench", overrides)
    parts = run_parts(base)
    root = Path(work_dir or tempfile.mkdtemp(prefix="sao-bench-"))
    model = tiny_model(str(root / "model"), seed=parts.seed)
    trajectories = parts.total_steps * parts.source.batch_size
    staleness = {"sync": 0, "async": max(parts.source.max_staleness, 1)}
    runs: dict[str, list[float]] = {"async": [], "sync": []}
    for rep in range(repeats):
        for mode in ("sync", "async"):
            config = load_recipe("bench", [*overrides,
                                           f"rollout.max_staleness={staleness[mode]}"])
            trainer = build_trainer(config, root / f"{mode}-{rep}", policy_path=model,
                                    batch_invariant=False)
            trainer.run()
            runs[mode].append(trajectories / trainer.loop_seconds)
    med = {m: sorted(v)[len(v) // 2] for m, v in runs.items()}
    return {
        "async_trajectories_per_s": med["async"],
        "sync_trajectories_per_s": med["sync"],
        "ratio": med["async"] / med["sync"],
        "runs": runs,
        "trajectories": trajectories,
        "config": {k: v for k, v in parts.sink.record.items() if k != "learner"},
    }
