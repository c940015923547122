"""Learner memory and step time against episode length: one episode of 2k to 16k tokens.

A long-horizon episode is one long sequence: the token-budget micro-batcher
cannot split it, so what it costs is set by its length. Each row trains one
learner for ``--steps`` steps on one synthetic multi-turn episode of ``L``
tokens (prompt, then alternating actions and observations; one micro-batch of
``L`` tokens), in a fresh process, and reports the median step time and the
peak resident memory above the process's size before the learner was built
(``benchmarks/learner_scale.py`` measures them; the peak is that of training:
it is reset once the learner is built, so loading's transient copies do not
hide it), with the estimate of
:func:`sao_gym.learner.memory.learner_memory` beside it.

Rows: ``ckpt`` (gradient checkpointing, what long episodes use) and, with
``--no-ckpt``, ``full`` (without it) at every length. The algorithm is
``--algorithm`` (``sao``: critic K=2 and policy; ``running_mean``: the policy
step alone, a third of the work). Then the growth: peak and time per token at
each length relative to the shortest, and the slope of peak memory between
consecutive lengths (linear growth: the slope stays flat).

    .venv/bin/python benchmarks/episode_length.py --model tiny --no-ckpt --algorithm sao
    .venv/bin/python benchmarks/episode_length.py --model smollm2 --algorithm running_mean \
        --steps 1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from learner_scale import estimate_mb, measure


def model_dir(name: str) -> str:
    """``tiny`` (the tiny Qwen2), ``smollm2`` (the offline copy), or a checkpoint dir."""
    if name == "tiny":
        from sao_gym.models import tiny_model
        return tiny_model(tempfile.mkdtemp(prefix="tiny-"), seed=0)
    if name == "smollm2":
        from sao_gym.models import smollm2
        return smollm2(str(Path(tempfile.gettempdir()) / "sao-gym-smollm2"))
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--steps", type=int, default=2, help="learner steps per row (median "
                    "of those after the first; 1: the only one)")
    ap.add_argument("--algorithm", default="sao")
    ap.add_argument("--no-ckpt", action="store_true", help="also rows without checkpointing")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    model = model_dir(args.model)
    out_dir = Path(tempfile.mkdtemp(prefix="episode-length-"))
    kinds = {"ckpt": True, **({"full": False} if args.no_ckpt else {})}
    results: dict[str, dict[int, dict]] = {k: {} for k in kinds}
    for kind, ckpt in kinds.items():
        for length in args.lengths:
            spec = {"gradient_checkpointing": ckpt, "rollouts": 1, "algorithm": args.algorithm,
                    "peak_of_training": True}
            t0 = time.monotonic()
            r = measure(f"{kind}{length}", model, length, args.steps, out_dir, spec)
            r["estimate_mb"] = estimate_mb(kind, model, length, spec)
            results[kind][length] = r
            print(f"{kind} {length}: step {r['step_s']:.1f} s, peak {r['peak_mb']:.0f} MB, "
                  f"estimate {r['estimate_mb']:.0f} MB ({time.monotonic() - t0:.0f} s)",
                  flush=True)
    print(f"\n{args.model}, {args.algorithm}, one episode per step, {args.steps} step(s)")
    print(f"{'row':<5} {'tokens':>6} {'step s':>7} {'ms/token':>8} {'peak MB':>8} "
          f"{'est. MB':>8} {'peak x':>7} {'MB per 1k tokens':>16}")
    growth = {}
    for kind, rows in results.items():
        first = rows[args.lengths[0]]
        prev = None
        slopes = []
        for length, r in rows.items():
            slope = ((r["peak_mb"] - prev[1]) / ((length - prev[0]) / 1024) if prev else None)
            if slope is not None:
                slopes.append(slope)
            print(f"{kind:<5} {length:>6} {r['step_s']:7.1f} {1e3 * r['step_s'] / length:8.2f} "
                  f"{r['peak_mb']:8.0f} {r['estimate_mb']:8.0f} "
                  f"{r['peak_mb'] / first['peak_mb']:7.2f} "
                  f"{'' if slope is None else f'{slope:.1f}':>16}")
            prev = (length, r["peak_mb"])
        growth[kind] = {"peak_slopes_mb_per_1k": slopes,
                        "slope_ratio_last_first": slopes[-1] / slopes[0] if slopes else None}
        if slopes:
            print(f"{kind}: last slope / first slope {slopes[-1] / slopes[0]:.2f} "
                  "(<= 1: at most linear growth)")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "algorithm": args.algorithm,
                                               "steps": args.steps, "results": results,
                                               "growth": growth}, indent=1))


if __name__ == "__main__":
    main()
