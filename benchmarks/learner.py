"""Learner cost per sample: one SAO step (critic included) against a GRPO step on the same batch.

Every learner is built from the same checkpoint and trained on the same batch
of synthetic multi-turn rollouts (groups of 8 rollouts per task, so GRPO can
use it), in turn within each repeat so machine noise hits all alike:

- ``bare``: a plain causal-LM step (forward, cross-entropy, backward, AdamW),
  the floor any policy step pays;
- ``grpo`` (PPO clip), ``grpo_dis``: the critic-free policy steps;
- ``sao``: the critic's K=2 updates (whose first pass also gives the values
  for GAE) plus the policy step; ``sao K=1`` with one critic update; ``sao 2L
  critic`` / ``sao 1L critic``: K=2 updates of a critic that keeps the first
  half of the policy's layers / its first layer (``learner.critic_layers``).

Reports median seconds and learner tokens/s per row, the SAO/GRPO ratios, and
the per-token logprob error of bf16 autocast against float32 on a slice of
the batch (and bf16 timings when the CPU has native bf16: elsewhere it is
tens of times slower and is not timed).

Run: .venv/bin/python benchmarks/learner.py --rollouts 64 --length 128 --repeats 5

``--json PATH`` also writes every repeat's time per row, the medians, the bf16
error, the peak RSS and how the script ran (``_record.py``).

``--scale`` measures the learner at scale instead (``benchmarks/learner_scale.py``):
full fine-tuning vs LoRA vs gradient checkpointing vs 2 FSDP ranks on
SmolLM2-135M (``--model``: a checkpoint directory, or ``smollm2``), each row's
step time and peak memory per rank against the memory estimate:

    .venv/bin/python benchmarks/learner.py --scale --model smollm2 --tokens 4096 --steps 2
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from _record import write_record

from sao_gym.learner.batching import micro_batches
from sao_gym.learner.learner import LearnerConfig, build_learner, native_bf16
from sao_gym.models import tiny_model
from sao_gym.types import Rollout, StopReason

GROUP = 8


def synthetic_rollouts(n: int, length: int, seed: int = 0) -> list[Rollout]:
    """Rollouts of ``length`` tokens: a prompt, then alternating action/observation spans."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids, mask = [], []
        while len(ids) < length:
            seg = rng.randint(8, 48)
            ids += [rng.randrange(1000) for _ in range(seg)]
            mask += [int(len(ids) > 32 and rng.random() < 0.6)] * seg
        ids, mask = ids[:length], mask[:length]
        mask[-1] = 1
        out.append(Rollout(ids, mask, [-1.0 * m for m in mask], [0 if m else -1 for m in mask],
                           float(rng.random() < 0.5), True, False, StopReason.TERMINATED, False,
                           [], "bench", f"t{i // GROUP}", None, {}))
    return out


def bare_step(model, opt, mbs) -> None:
    for mb in mbs:
        logits = model(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT).logits
        V = logits.shape[-1]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(),
                               mb.input_ids_BT[:, 1:].reshape(-1), reduction="sum")
        (loss / mb.num_tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def bf16_logprob_error(path: str, rollouts: list[Rollout]) -> tuple[float, float]:
    """(max, mean) |logprob_bf16 - logprob_fp32| over the action tokens of ``rollouts``."""
    fp32 = build_learner("sao", path, LearnerConfig())
    bf16 = build_learner("sao", path, LearnerConfig(autocast="bfloat16"))
    errs = []
    with torch.no_grad():
        for mb in micro_batches(rollouts, 4096):
            mask = mb.action_mask_BT > 0
            a, b = fp32.score(mb)[0], bf16.score(mb)[0]
            errs.append((a - b)[mask].abs())
    err = torch.cat(errs)
    return float(err.max()), float(err.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256, help="tiny model width (256: ~4M params)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--scale", action="store_true", help="the rows of learner_scale.py instead")
    ap.add_argument("--model", default="smollm2", help="--scale: checkpoint dir or smollm2")
    ap.add_argument("--tokens", type=int, default=4096, help="--scale: tokens per micro-batch")
    ap.add_argument("--steps", type=int, default=2, help="--scale: learner steps per row")
    ap.add_argument("--rows", nargs="+", default=["full", "lora", "ckpt", "fsdp2"])
    ap.add_argument("--json", help="also write the raw results to this file")
    args = ap.parse_args()
    if args.scale:
        scale(args)
        return
    torch.manual_seed(0)
    path = tiny_model(tempfile.mkdtemp() + "/model", hidden_size=args.hidden,
                      num_layers=args.layers)
    rollouts = synthetic_rollouts(args.rollouts, args.length)
    tokens = sum(len(r.token_ids) for r in rollouts)

    def cfg(**kw):
        return LearnerConfig(lr=1e-6, critic_warmup_steps=0,
                             max_tokens_per_microbatch=args.max_tokens, **kw)

    learners = {"grpo": build_learner("grpo", path, cfg(), group_size=GROUP),
                "grpo_dis": build_learner("grpo_dis", path, cfg(), group_size=GROUP),
                "sao": build_learner("sao", path, cfg()),
                "sao K=1": build_learner("sao", path, cfg(critic_updates=1)),
                **{f"sao {n}L critic": build_learner("sao", path, cfg(critic_layers=n))
                   for n in sorted({max(1, args.layers // 2), 1})}}
    if native_bf16():
        learners["sao bf16"] = build_learner("sao", path, cfg(autocast="bfloat16"))
        learners["grpo bf16"] = build_learner("grpo", path, cfg(autocast="bfloat16"),
                                              group_size=GROUP)
    bare_model = learners["grpo"].policy
    bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-6)
    mbs = micro_batches(rollouts, args.max_tokens)
    steps = {"bare": lambda: bare_step(bare_model, bare_opt, mbs),
             **{name: (lambda lr=lr: lr.update(rollouts)) for name, lr in learners.items()}}
    for step in steps.values():  # warm up
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(args.repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
        print(f"repeat {rep}: " + "  ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()),
              flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{args.rollouts} rollouts x {args.length} tokens = {tokens} tokens per batch, "
          f"{torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, native bf16: {native_bf16()}")
    print(f"{'step':<16} {'median s':>9} {'tokens/s':>9} {'x grpo':>7} {'x grpo_dis':>10}")
    for name, t in med.items():
        print(f"{name:<16} {t:9.3f} {tokens / t:9.0f} {t / med['grpo']:7.2f} "
              f"{t / med['grpo_dis']:10.2f}")
    worst, mean = bf16_logprob_error(path, rollouts[:8])
    print(f"bf16 autocast logprob error vs fp32 (action tokens of 8 rollouts): "
          f"max {worst:.4f}, mean {mean:.5f}")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss_mb:.0f} MB")
    if args.json:
        write_record(args.json, {
            "settings": {k: getattr(args, k) for k in ("rollouts", "length", "repeats",
                                                       "max_tokens", "hidden", "layers")},
            "tokens": tokens, "native_bf16": native_bf16(), "times_s": times,
            "median_s": med, "bf16_logprob_error": {"max": worst, "mean": mean},
            "peak_rss_mb": round(rss_mb, 1)})


def scale(args: argparse.Namespace) -> None:
    """``--scale``: the rows of ``benchmarks/learner_scale.py`` in one run."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from learner_scale import run

    from sao_gym.models import smollm2

    model = smollm2(tempfile.mkdtemp() + "/smollm2") if args.model == "smollm2" else args.model
    result = run(model, args.tokens, args.steps, args.rows)
    if args.json:
        write_record(args.json, result)


if __name__ == "__main__":
    main()
