"""Long-run stability: RSS growth and non-finite metrics over many learner steps.

Runs the async trainer on the tiny model (Arithmetic, batch_size 4) for
`--steps` learner steps, sampling the process RSS after every step.
Reports RSS at step 100 and at the end, the growth after step 100 (the peak
after step 100 over the value at step 100), and the
number of non-finite metric values logged (JSON nulls in metrics.jsonl).

``--json PATH`` also writes the RSS after every step and how the script ran
(``_record.py``).

Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/soak.py --steps 1000 --json docs/data/soak.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

from _record import write_record

from sao_gym.logging import read_metrics
from sao_gym.models import COMPACT_TOOLS_TEMPLATE, tiny_model
from sao_gym.runtime.config.build import build_trainer
from sao_gym.runtime.config.loader import load_config
from sao_gym.utils.memory import rss_mb


class RssProbe:
    """Stands in for the progress display: records RSS after each step."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float]] = []
        self.t0 = time.monotonic()

    def log(self, step: int, metrics) -> None:
        self.samples.append((step, rss_mb()))
        if step % 50 == 0:
            print(f"step {step}: rss {self.samples[-1][1]:.0f} MB, "
                  f"{time.monotonic() - self.t0:.0f} s", flush=True)

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--hidden-size", type=int, default=128, help="tiny model width (the demo's)")
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--json", help="also write the result and every RSS sample here")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="sao-soak-"))
    model = tiny_model(str(root / "model"), hidden_size=args.hidden_size,
                       num_layers=args.num_layers, chat_template=COMPACT_TOOLS_TEMPLATE)
    cfg = load_config(None, [
        "env=sao_gym/Arithmetic-v0", f"total_steps={args.steps}",
        f"rollout.batch_size={args.batch_size}",
        "rollout.concurrency=8", "rollout.max_new_tokens=16", "rollout.max_episode_steps=3",
        "rollout.max_context_tokens=1024", "checkpoint.every=250", "learner.lr=1e-4",
        "learner.critic_warmup_steps=10"])
    probe = RssProbe()
    trainer = build_trainer(cfg, root / "run", policy_path=model, sinks=[probe])
    trainer.run()
    rows = read_metrics(root / "run")
    nonfinite = sum(1 for r in rows for v in r.values()
                    if v is None or (isinstance(v, float) and not math.isfinite(v)))
    at = dict(probe.samples)
    base = at.get(100, probe.samples[0][1])
    end = probe.samples[-1][1]
    peak = max(r for s, r in probe.samples if s >= 100) if len(probe.samples) > 100 else end
    result = {
        "steps": len(rows), "loop_seconds": round(trainer.loop_seconds, 1),
        "rss_mb_step_100": round(base, 1), "rss_mb_end": round(end, 1),
        "rss_mb_max_after_100": round(peak, 1),
        "rss_growth_after_100": round(peak / base - 1, 4),
        "nonfinite_values": nonfinite,
        "run_dir": str(root / "run"),
    }
    print(json.dumps(result))
    if args.json:
        write_record(args.json, {
            **result, "settings": {k: getattr(args, k) for k in (
                "steps", "batch_size", "hidden_size", "num_layers")},
            "rss_mb_by_step": [[step, round(mb, 1)] for step, mb in probe.samples]})


if __name__ == "__main__":
    main()
