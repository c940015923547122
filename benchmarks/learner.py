"""Learner throughput: SAO's policy step vs the model's bare forward+backward.

Both run on the same model instance and batch (synthetic multi-turn rollouts on the
tiny model), alternating per repeat. "bare" is a standard causal-LM step:
forward, cross-entropy over all tokens, backward, AdamW step, micro-batched
the same way. "SAO policy" is everything an SAO update does except the
critic's own work: packing, forward, per-token logprobs, DIS loss, entropy,
backward, clipping, optimizer step. Overhead = SAO policy time / bare time - 1.

Run: .venv/bin/python benchmarks/learner.py --rollouts 16 --repeats 5
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

from sao_gym.learner.batching import micro_batches
from sao_gym.learner.sao import LearnerConfig, build_learner
from sao_gym.models import tiny_model
from sao_gym.types import Rollout, StopReason


def synthetic_rollouts(n: int, length: int, seed: int = 0) -> list[Rollout]:
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
                           float(i % 2), True, False, StopReason.TERMINATED, False, [], "bench",
                           f"t{i}", None, {}))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=2048)
    args = ap.parse_args()
    torch.manual_seed(0)
    path = tiny_model(tempfile.mkdtemp() + "/model")
    cfg = LearnerConfig(lr=1e-5, critic_warmup_steps=0, max_tokens_per_microbatch=args.max_tokens)
    learner = build_learner("sao", path, cfg)
    rollouts = synthetic_rollouts(args.rollouts, args.length)
    tokens = sum(len(r.token_ids) for r in rollouts)
    bare_model = learner.policy  # the same module: only the step around it differs
    bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-5)
    learner.update(rollouts)  # warm up both
    bare_step(bare_model, bare_opt, micro_batches(rollouts, args.max_tokens))
    rows = []
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        bare_step(bare_model, bare_opt, micro_batches(rollouts, args.max_tokens))
        bare = time.perf_counter() - t0
        m = learner.update(rollouts)
        sao_policy = m["learner/step_time_s"] - m["learner/critic_time_s"]
        rows.append((bare, sao_policy, m["learner/critic_time_s"], m["learner/step_time_s"]))
        print(f"repeat {rep}: bare {bare:.3f}s  sao-policy {sao_policy:.3f}s  "
              f"critic {rows[-1][2]:.3f}s  whole update {rows[-1][3]:.3f}s  "
              f"overhead {sao_policy / bare - 1:+.1%}")
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    overheads = [r[1] / r[0] - 1 for r in rows]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\n{args.rollouts} rollouts x {args.length} tokens = {tokens} tokens per batch")
    print(f"median bare fwd+bwd:   {med[0]:.3f}s  ({tokens / med[0]:.0f} tok/s)")
    print(f"median SAO policy:     {med[1]:.3f}s  ({tokens / med[1]:.0f} tok/s)")
    print(f"median critic (K=2):   {med[2]:.3f}s")
    print(f"median whole update:   {med[3]:.3f}s  ({tokens / med[3]:.0f} tok/s)")
    print(f"SAO policy overhead:   {statistics.median(overheads):+.1%} (median of repeats)")
    print(f"peak RSS:              {rss_mb:.0f} MB")


if __name__ == "__main__":
    main()
