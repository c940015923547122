"""Where greedy decoding leaves a demonstration: the tokens a warm start gets wrong.

    python benchmarks/copy_confusions.py RUN [--episodes 128] [--json OUT]

``RUN`` is a ``sao-gym train`` run directory (its warm start,
``RUN/model/warm_start``, and its ``config.yaml`` give the checkpoint, the env
and the budgets) or a checkpoint directory with ``--env``. The env's registered
oracle plays ``--episodes`` tasks from env seed ``--seed`` (by default
2,000,000, far from the seeds a run trains or evaluates on); each
demonstration is read teacher-forced, and its first action token that is not
the checkpoint's argmax is the greedy failure. Printed, and with ``--json``
written: the share of demonstrations greedy decoding reproduces, the failures
counted by the call they are in (the turn's text up to its ``(``) and by
(wanted token, argmax token), and, for each confused pair, the
cosine of the two tokens' input embeddings and of their LM-head rows, against
the mean over all pairs of wanted tokens.

A pair whose embeddings are nearly parallel (cosine near 1) is a model that
cannot tell the two words apart, whatever it was taught: docs/results.md,
"Your own environment", has the case that made the CPU recipe untie its head.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import sys
from pathlib import Path

import torch
import yaml

from sao_gym.registration import env_oracle, resolve_id
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations


def first_misses(model, demos) -> list[tuple[int, int, int] | None]:
    """Per demonstration: ``(position, wanted, argmax)`` of its first greedy miss, or None."""
    out = []
    with torch.no_grad():
        for d in demos:
            ids = torch.tensor([d.token_ids])
            pred = model(input_ids=ids).logits[0, :-1].argmax(-1).tolist()
            miss = next(((i, d.token_ids[i], pred[i - 1]) for i in range(1, len(d.token_ids))
                         if d.loss_mask[i] and pred[i - 1] != d.token_ids[i]), None)
            out.append(miss)
    return out


def _turn_head(tokenizer, demo, position: int) -> str:
    """The text of ``position``'s turn before it, up to a call's ``(``: which call it was in."""
    start = max((j for j in range(position) if not demo.loss_mask[j]), default=-1) + 1
    return tokenizer.decode(demo.token_ids[start:position]).split("(")[0].strip()


def _cosine(weight: torch.Tensor, a: int, b: int) -> float:
    return float(torch.nn.functional.cosine_similarity(weight[a], weight[b], dim=0))


def confusions(model, tokenizer, demos) -> dict:
    """The report (module docs) of ``model`` on ``demos``."""
    misses = first_misses(model, demos)
    pairs = collections.Counter((w, p) for m in misses if m for _, w, p in [m])
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    wanted = sorted({t for d in demos for t, m in zip(d.token_ids, d.loss_mask, strict=True)
                     if m})
    every = list(itertools.combinations(wanted, 2))
    return {
        "episodes": len(demos),
        "greedy_reproduced": sum(m is None for m in misses) / len(demos),
        "tied": bool(model.config.tie_word_embeddings),
        "by_call": dict(collections.Counter(
            _turn_head(tokenizer, d, m[0]) for d, m in zip(demos, misses, strict=True) if m
        ).most_common()),
        "confusions": [{"wanted": tokenizer.decode([w]), "argmax": tokenizer.decode([p]),
                        "count": n, "embedding_cosine": round(_cosine(embed, w, p), 4),
                        "head_cosine": round(_cosine(head, w, p), 4)}
                       for (w, p), n in pairs.most_common()],
        "mean_cosine_of_action_tokens": {
            "pairs": len(every),
            "embedding": round(sum(_cosine(embed, a, b) for a, b in every) / len(every), 4),
            "head": round(sum(_cosine(head, a, b) for a, b in every) / len(every), 4)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a run directory, or a checkpoint with --env")
    p.add_argument("--env", help="the env id (default: the run's config.yaml)")
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--seed", type=int, default=2_000_000)
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = args.run / "config.yaml"
    settings = yaml.safe_load(config.read_text()) if config.exists() else {}
    checkpoint = args.run / "model" / "warm_start" if config.exists() else args.run
    env = args.env or settings.get("env")
    if env is None:
        p.error("a checkpoint needs --env")
    env_id = resolve_id(env)
    oracle = env_oracle(env_id)
    if oracle is None:
        p.error(f"{env} registers no oracle")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    rollout = settings.get("rollout", {})
    demos = collect_demonstrations(
        env_id, tokenizer, oracle, episodes=args.episodes, seed=args.seed,
        env_kwargs=settings.get("env_kwargs") or {},
        max_new_tokens=rollout.get("max_new_tokens") or 256,
        max_context_tokens=rollout.get("max_context_tokens"))
    report = {"checkpoint": str(checkpoint), "env": env, "seed": args.seed,
              **confusions(model, tokenizer, demos)}
    print(f"{env}: greedy reproduces {report['greedy_reproduced']:.3f} of {len(demos)} "
          f"demonstrations ({'tied' if report['tied'] else 'untied'} head)")
    print("  first misses, by the call they are in: " + ", ".join(
        f"{name or '(start of turn)'} {n}" for name, n in report["by_call"].items()))
    for c in report["confusions"][:12]:
        print(f"  {c['count']:4d} x {c['wanted']!r} -> {c['argmax']!r}: embedding cosine "
              f"{c['embedding_cosine']:.2f}, head {c['head_cosine']:.2f}")
    mean = report["mean_cosine_of_action_tokens"]
    print(f"  mean over {mean['pairs']} pairs of action tokens: embedding "
          f"{mean['embedding']:.2f}, head {mean['head']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
