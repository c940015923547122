"""The gateway's overhead: a harness through HTTP against the in-process LLMAgent, side by side.

Both paths play the same KeyChain tasks with the same model on one in-process
``HFBackend``, ``--concurrency`` episodes at once:

- ``llm_agent``: ``LLMAgent`` driving the env (``run_episodes``), the package's path;
- ``gateway_workers_N``: the ``openai`` client loop of
  examples/harnesses/openai_loop.py, unmodified, calling the run's gateway over
  local HTTP (:class:`~sao_gym.gateway.rollouts.HarnessRollouts`), which stitches
  its calls into token-exact rollouts; the harness runs on this process's event
  loop (N = 0) or in N worker processes (``--workers``, ``agent.workers``).

Greedy decoding (temperature 0) makes the two paths sample the same tokens for
the same prompts (the harness sends the env's own messages and tools), so both
do the same model work and the difference is the gateway's: HTTP, JSON,
rendering and matching each call's messages. Rounds rotate the paths (noise
hits all alike); the result is each path's median trajectories per second and
its ratio to llm_agent's, with the backend's work of each round (decode steps,
prefills) in the raw rows.

Run: .venv/bin/python benchmarks/gateway_overhead.py --model PATH --concurrency 32 \
        --episodes 128 --rounds 5 --workers 0 1 [--threads 1] \
        --out docs/data/gateway_overhead.json
(``--model tiny``: a random tiny model, whose turns run to ``--max-new-tokens``;
``--model smollm2``: SmolLM2-135M-Instruct.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples.harnesses


async def llm_agent(backend, tokenizer, args, seed: int) -> tuple[float, list]:
    import functools

    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.evaluation import run_episodes

    make_env = functools.partial(sao_gym.make, "sao_gym/KeyChain-v0", hops=args.hops)
    make_agent = functools.partial(LLMAgent, backend, tokenizer,
                                   max_new_tokens=args.max_new_tokens, temperature=0.0,
                                   max_context_tokens=args.max_context_tokens)
    start = time.perf_counter()
    rollouts = await run_episodes(make_env, make_agent, args.episodes,
                                  concurrency=args.concurrency, seed=seed)
    return time.perf_counter() - start, rollouts


async def gateway(runs, args, seed: int) -> tuple[float, list]:
    from sao_gym.evaluation import play_seeds

    start = time.perf_counter()
    rollouts = await play_seeds(runs.play, args.episodes, concurrency=args.concurrency,
                                seed=seed)
    return time.perf_counter() - start, rollouts


def _counts(stats) -> dict[str, int]:
    """The backend's work so far: decode steps (and rows they sampled), prefills."""
    return {"decode_steps": sum(stats.batch_sizes.values()),
            "decoded_rows": sum(k * v for k, v in stats.batch_sizes.items()),
            "prefill_calls": stats.prefill_calls, "prefill_tokens": stats.prefill_tokens,
            "reused_tokens": stats.reused_tokens}


async def run(args: argparse.Namespace) -> dict:
    from sao_gym.gateway.harness import Harness
    from sao_gym.gateway.rollouts import HarnessRollouts
    from sao_gym.gateway.tasks import TaskSource
    from sao_gym.inference import HFBackend
    from sao_gym.models import smollm2, tiny_model

    model = (tiny_model(tempfile.mkdtemp()) if args.model == "tiny"
             else smollm2(tempfile.mkdtemp() + "/smollm2") if args.model == "smollm2"
             else args.model)
    backend = HFBackend(model, seed=0, max_batch_size=args.concurrency)
    tokenizer = backend.tokenizer
    paths = {f"gateway_workers_{n}": HarnessRollouts(
        Harness("examples.harnesses.openai_loop:run", timeout_s=600),
        TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": args.hops}),
        backend, tokenizer, max_new_tokens=args.max_new_tokens,
        max_context_tokens=args.max_context_tokens, temperature=0.0, workers=n)
        for n in args.workers}
    names = ["llm_agent", *paths]
    rows: dict[str, list[dict]] = {name: [] for name in names}
    try:
        for runs in paths.values():  # connections, worker processes, imports
            await gateway(runs, argparse.Namespace(**{**vars(args), "episodes": 8}), 10_000)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                seed = 1000 * r
                before = _counts(backend.stats)
                wall, rollouts = (await llm_agent(backend, tokenizer, args, seed)
                                  if name == "llm_agent" else
                                  await gateway(paths[name], args, seed))
                failures = sum(x.infra_failure for x in rollouts)
                rows[name].append({
                    "round": r, "wall_s": round(wall, 3),
                    "traj_per_s": round(len(rollouts) / wall, 3),
                    "turns": sum(x.metrics["turns"] for x in rollouts),
                    "action_tokens": sum(x.num_action_tokens for x in rollouts),
                    "success": sum(x.reward > 0 for x in rollouts), "infra_failures": failures,
                    **{k: v - before[k] for k, v in _counts(backend.stats).items()}})
                print(name, rows[name][-1], flush=True)
    finally:
        for runs in paths.values():
            await runs.aclose()
    medians = {k: statistics.median(x["traj_per_s"] for x in v) for k, v in rows.items()}
    import torch

    return {"model": str(args.model), "torch_threads": torch.get_num_threads(),
            "hops": args.hops, "episodes": args.episodes,
            "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens,
            "rounds": rows, "median_traj_per_s": medians,
            "ratio_over_llm_agent": {k: round(medians[k] / medians["llm_agent"], 3)
                                     for k in paths}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--hops", type=int, default=4)
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-context-tokens", type=int, default=1024)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1],
                   help="the gateway paths measured: harness worker processes of each "
                        "(0: the harness on the gateway's own event loop)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the process (both paths' backend); default torch's")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    result = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
