"""KV reuse across turns: long episodes with and without it, side by side.

Each episode is a real ``sao_gym/KeyChain-v0`` episode played by ``LLMAgent``
through an in-process ``HFBackend``: the agent sends the whole conversation
every turn, with its session id. With reuse the backend keeps the episode's
KV between turns and prefills only the new tokens; without it
(``session_cache_bytes=0``) every turn is prefilled whole. The untrained
model's actions are mostly wrong keys, so every episode runs to its turn
budget (``--turns``), which is what is measured. Rows alternate (reuse, none,
reuse, none, ...) so machine noise hits both alike.

Per row: wall seconds per episode (median), tokens prefilled per turn (mean),
reused tokens per turn, and the speed-up of reuse at the median.

Run: .venv/bin/python benchmarks/kv_reuse.py --model smollm2 --turns 32 --episodes 3 \
        --json docs/data/kv_reuse_smollm2.json

``--json`` writes every episode of both rows, the medians and how the script
ran (``_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from _record import write_record


async def episode(backend, tokenizer, seed: int, turns: int, max_new_tokens: int) -> dict:
    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.rollout import run_episode

    hops = max(1, turns - 1 - max(2, (turns - 1) // 4))  # budget: hops + 1 + slack == turns
    slack = turns - 1 - hops
    env = sao_gym.make("sao_gym/KeyChain-v0", hops=hops, slack=slack)
    agent = LLMAgent(backend, tokenizer, max_new_tokens=max_new_tokens, temperature=1.0)
    before = (backend.stats.prefill_tokens, backend.stats.reused_tokens)
    t0 = time.perf_counter()
    rollout = await run_episode(env, agent, seed=seed)
    wall = time.perf_counter() - t0
    n = rollout.metrics["turns"]
    return {"wall_s": wall, "turns": n, "tokens": len(rollout.token_ids),
            "prefill_per_turn": (backend.stats.prefill_tokens - before[0]) / n,
            "reused_per_turn": (backend.stats.reused_tokens - before[1]) / n}


async def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from sao_gym.inference import HFBackend
    from sao_gym.models import smollm2

    model = smollm2(tempfile.mkdtemp() + "/smollm2") if args.model == "smollm2" else args.model
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows: dict[str, list[dict]] = {"reuse": [], "none": []}
    backends = {"reuse": HFBackend(model, seed=0),
                "none": HFBackend(model, seed=0, session_cache_bytes=0)}
    try:
        for i in range(args.episodes):
            for name in ("reuse", "none"):
                r = await episode(backends[name], tokenizer, i, args.turns, args.max_new_tokens)
                rows[name].append(r)
                print(f"{name:5} episode {i}: {r['wall_s']:6.1f} s, {r['turns']} turns, "
                      f"{r['tokens']} tokens, prefilled {r['prefill_per_turn']:.0f}/turn, "
                      f"reused {r['reused_per_turn']:.0f}/turn", flush=True)
    finally:
        for b in backends.values():
            await b.aclose()
    out = {name: {"wall_s_median": statistics.median(r["wall_s"] for r in rs),
                  "prefill_per_turn": statistics.mean(r["prefill_per_turn"] for r in rs),
                  "reused_per_turn": statistics.mean(r["reused_per_turn"] for r in rs),
                  "turns": statistics.mean(r["turns"] for r in rs),
                  "tokens": statistics.mean(r["tokens"] for r in rs), "episodes": rs}
           for name, rs in rows.items()}
    out["speedup"] = out["none"]["wall_s_median"] / out["reuse"]["wall_s_median"]
    print(f"\n{args.turns}-turn episodes, {args.episodes} each: median wall "
          f"{out['reuse']['wall_s_median']:.1f} s with reuse vs "
          f"{out['none']['wall_s_median']:.1f} s without: {out['speedup']:.2f}x; prefilled "
          f"{out['reuse']['prefill_per_turn']:.0f} vs {out['none']['prefill_per_turn']:.0f} "
          "tokens per turn")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="checkpoint dir, or smollm2")
    ap.add_argument("--turns", type=int, default=32)
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    if args.json:
        write_record(args.json, {"settings": {k: getattr(args, k) for k in (
            "model", "turns", "episodes", "max_new_tokens")}, **out})


if __name__ == "__main__":
    main()
