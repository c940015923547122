"""Environment-side cost: time per step (no generation) and scripted episodes/s.

For each environment, ``--episodes`` episodes (default 32) run at once on one
event loop, each driven by a scripted oracle that solves its task the way an
agent would (tool calls in OpenAI format):

- Arithmetic: ``calculator(expression)``, ``submit(answer)``;
- MathTIR: ``python("print(...)")``, ``submit_answer(answer)``;
- CoqProof: ``check_proof(reference)``, ``submit_proof(reference)``;
- CodeRepo: ``write_file`` the reference patch, ``bash("git apply ...")``,
  ``run_tests()``, ``submit()``.

Every ``reset`` and ``step`` is timed where the env sees it (``areset`` /
``astep``), so the numbers are the environment's own latency under that
concurrency, sandbox start-up included. Reports per environment: reset and
step median / p95 in ms (all steps together and per tool), episodes/s over
the whole wave (wall time from the first reset to the last step), and the
share of episodes that scored 1 (a check that the oracle really solved them).

Run (local bubblewrap sandboxes)::

    .venv/bin/python benchmarks/envs.py --episodes 32
    .venv/bin/python benchmarks/envs.py --envs CoqProof --sandbox docker

Ends with one JSON line holding every number; ``--json PATH`` also writes them
with every reset's and step's time and how the script ran (``_record.py``):

    .venv/bin/python benchmarks/envs.py --episodes 32 --json docs/data/envs_local.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from _record import write_record

import sao_gym


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message with one OpenAI-style tool call."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def arithmetic_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [call("calculator", expression=task["expression"]),
            call("submit", answer=task["answer"])]


def math_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [call("python", code=f"print({json.dumps(str(task['answer']))})"),
            call("submit_answer", answer=str(task["answer"]))]


def coq_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [call("check_proof", script=task["reference_proof"]),
            call("submit_proof", script=task["reference_proof"])]


def code_actions(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [call("write_file", path="ref.diff", content=task["reference_patch"]),
            call("bash", command="git apply ref.diff && rm ref.diff"),
            call("run_tests"), call("submit")]


ENVS: dict[str, tuple[str, Callable[[dict[str, Any]], list[dict[str, Any]]], bool]] = {
    # name: (id, oracle, takes a sandbox kwarg)
    "Arithmetic": ("sao_gym/Arithmetic-v0", arithmetic_actions, False),
    "MathTIR": ("sao_gym/MathTIR-v0", math_actions, True),
    "CoqProof": ("sao_gym/CoqProof-v0", coq_actions, True),
    "CodeRepo": ("sao_gym/CodeRepo-v0", code_actions, True),
}


def quantiles(xs: list[float]) -> dict[str, float]:
    """Median and p95 in milliseconds."""
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return {"median_ms": round(1000 * statistics.median(xs), 1), "p95_ms": round(1000 * p95, 1),
            "n": len(xs)}


async def episode(env_id: str, oracle, kwargs: dict[str, Any], seed: int,
                  times: dict[str, list[float]]) -> float:
    """One scripted episode; returns its reward (timings go to ``times``)."""
    env = sao_gym.make(env_id, **kwargs)
    try:
        t = time.perf_counter()
        await env.unwrapped.areset(seed=seed)
        times["reset"].append(time.perf_counter() - t)
        reward = 0.0
        for action in oracle(env.unwrapped.task):
            t = time.perf_counter()
            _, r, terminated, truncated, _ = await env.unwrapped.astep(action)
            dt = time.perf_counter() - t
            times["step"].append(dt)
            times[action["tool_calls"][0]["function"]["name"]].append(dt)
            reward += r
            if terminated or truncated:
                break
        return reward
    finally:
        await env.unwrapped.aclose()


async def bench_env(name: str, episodes: int, sandbox: str, seed: int) -> dict[str, Any]:
    env_id, oracle, sandboxed = ENVS[name]
    kwargs = {"sandbox": sandbox} if sandboxed else {}
    times: dict[str, list[float]] = defaultdict(list)
    # warm-up: imports, data loading and the first sandbox start stay out of the numbers
    await episode(env_id, oracle, kwargs, seed + 10_000, defaultdict(list))
    start = time.perf_counter()
    rewards = await asyncio.gather(*(episode(env_id, oracle, kwargs, seed + i, times)
                                     for i in range(episodes)))
    wall = time.perf_counter() - start
    return {
        "env": env_id, "episodes": episodes, "concurrency": episodes,
        "episodes_per_s": round(episodes / wall, 2), "wall_s": round(wall, 2),
        "solved_rate": sum(r >= 1.0 for r in rewards) / episodes,
        **{k: quantiles(v) for k, v in times.items()},
        "times_ms": {k: [round(1000 * x, 3) for x in v] for k, v in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="*", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--episodes", type=int, default=32, help="episodes, all running at once")
    ap.add_argument("--sandbox", default="local", help="local or docker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results and every timing here")
    args = ap.parse_args()
    results = {}
    for name in args.envs:
        r = asyncio.run(bench_env(name, args.episodes, args.sandbox, args.seed))
        results[name] = r
        print(f"{name:11s} {r['episodes_per_s']:7.2f} episodes/s  "
              f"step median {r['step']['median_ms']:8.1f} ms  p95 {r['step']['p95_ms']:8.1f} ms  "
              f"reset median {r['reset']['median_ms']:7.1f} ms  solved {r['solved_rate']:.2f}",
              flush=True)
    print(json.dumps({name: {k: v for k, v in r.items() if k != "times_ms"}
                      for name, r in results.items()}))
    if args.json:
        write_record(args.json, {"sandbox": args.sandbox, "seed": args.seed, "envs": results})


if __name__ == "__main__":
    main()
