"""Does the tiny model learn Arithmetic? Warm start, then SAO, timed per phase.

The research harness behind the embedded demo's configuration. One run:

1. build the random tiny model (``tiny_model``, compact tool template);
2. collect oracle demonstrations of ``sao_gym/Arithmetic-v0`` in the agent's
   exact token layout (``collect_demonstrations`` + ``arithmetic_oracle``);
3. a deliberately short supervised warm start (``sft``);
4. evaluate the warm-start checkpoint;
5. SAO in a simple synchronous loop: play ``--batch-size`` episodes with
   ``LLMAgent`` + ``HFBackend`` at temperature 1, ``learner.update``, push the
   new weights to the backend; evaluate every ``--eval-every`` steps;
6. evaluate the final policy.

The metric is the **success rate at temperature 1.0** (top-p 1, the RL
sampling; reward 1 = exact answer) over ``--eval-episodes`` episodes with a
fixed set of evaluation tasks (env seeds from 1,000,000, never used for
demonstrations or training; the sampling seeds follow ``--seed``).
Everything else follows ``--seed``: model init, demonstration tasks, SFT data
order, training tasks, sampling and the critic head.

Run (one seed; prints a JSON summary, ``--out`` keeps it and the checkpoints)::

    .venv/bin/python benchmarks/demo_learning.py --seed 0
    .venv/bin/python benchmarks/demo_learning.py --seeds 0 1 2   # in sequence, with a median
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import sao_gym
from sao_gym.agents import LLMAgent
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.inference.hf.backend import HFBackend
from sao_gym.learner.learner import LearnerConfig, build_learner
from sao_gym.learner.sft import SFTSettings, sft
from sao_gym.models import CHATML_TOOLS_TEMPLATE, COMPACT_TOOLS_TEMPLATE, tiny_model
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations
from sao_gym.types import Rollout

ENV_ID = "sao_gym/Arithmetic-v0"
EVAL_SEED = 1_000_000
DEMO_SEED = 2_000_000
TRAIN_SEED = 3_000_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="*", help="run these seeds in sequence")
    p.add_argument("--out", type=Path, help="keep checkpoints and summaries here")
    p.add_argument("--warm", type=Path,
                   help="start RL from this warm-start checkpoint (skips model, demos, SFT)")
    # model and task
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--template", choices=("compact", "chatml"), default="compact")
    p.add_argument("--num-operands", type=int, default=2)
    p.add_argument("--max-value", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-context-tokens", type=int, default=512)
    # warm start
    p.add_argument("--demos", type=int, default=256)
    p.add_argument("--direct-rate", type=float, default=0.0,
                   help="share of demonstrations that submit at once, without the calculator")
    p.add_argument("--slip-rate", type=float, default=0.0,
                   help="share of demonstrations that miscopy one digit of the result")
    p.add_argument("--sft-steps", type=int, default=40)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--sft-warmup", type=int, default=0)
    # RL
    p.add_argument("--algorithm", default="sao")
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--critic-lr", type=float)
    p.add_argument("--lr-warmup", type=int, default=0,
                   help="RL steps over which both learning rates rise linearly")
    p.add_argument("--critic-warmup", type=int, default=0)
    p.add_argument("--critic-updates", type=int, default=2)
    p.add_argument("--critic-freeze", default="attention", choices=("attention", "none"))
    p.add_argument("--pretrain-critic", type=int, default=0,
                   help="critic-only steps on the warm-start evaluation rollouts")
    p.add_argument("--eps-low", type=float, default=0.3)
    p.add_argument("--eps-high", type=float, default=5.0)
    p.add_argument("--aggregation", default="token_mean")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    # evaluation
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=0, help="0: only before and after RL")
    p.add_argument("--mid-eval-episodes", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def make_env(args: argparse.Namespace):
    return sao_gym.make(ENV_ID, num_operands=args.num_operands, max_value=args.max_value)


def agent_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_new_tokens": args.max_new_tokens, "max_context_tokens": args.max_context_tokens}


async def play(backend, tokenizer, args, episodes: int, *, env_seed: int, sample_seed: int,
               concurrency: int) -> list[Rollout]:
    """Episodes at temperature 1 with per-episode sampling seeds (reproducible)."""
    counter = iter(range(episodes))

    def make_agent() -> LLMAgent:
        return LLMAgent(backend, tokenizer, temperature=1.0,
                        seed=sample_seed + next(counter), **agent_kwargs(args))

    return await run_episodes(lambda: make_env(args), make_agent, episodes,
                              concurrency=concurrency, seed=env_seed)


def failure_modes(rollouts: list[Rollout]) -> dict[str, int]:
    """Rough categories of what went wrong (for the research log)."""
    out: dict[str, int] = {}
    for r in rollouts:
        if r.reward >= 1:
            key = "solved" if r.metrics.get("turns", 0) > 1 else "direct_solved"
        elif r.stop_reason.value != "terminated":
            key = r.stop_reason.value
        elif r.metrics.get("turns", 0) <= 1:
            key = "direct_wrong"
        else:
            key = "wrong_answer"
        out[key] = out.get(key, 0) + 1
    return out


def run_one(args: argparse.Namespace, seed: int, work: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    times: dict[str, float] = {}
    result: dict[str, Any] = {"seed": seed}
    t0 = time.perf_counter()
    if args.warm:
        tokenizer = AutoTokenizer.from_pretrained(args.warm)
        return asyncio.run(_rl(args, seed, str(args.warm), tokenizer, result, times, t0, work))
    template = COMPACT_TOOLS_TEMPLATE if args.template == "compact" else CHATML_TOOLS_TEMPLATE
    base = tiny_model(work / "base", hidden_size=args.hidden_size, num_layers=args.num_layers,
                      seed=seed, chat_template=template)
    tokenizer = AutoTokenizer.from_pretrained(base)
    times["build"] = time.perf_counter() - t0

    t = time.perf_counter()
    oracle = functools.partial(arithmetic_oracle, direct_rate=args.direct_rate,
                               slip_rate=args.slip_rate, seed=seed)
    demos = collect_demonstrations(
        ENV_ID, tokenizer, oracle, episodes=args.demos,
        seed=DEMO_SEED + 10_000 * seed,
        env_kwargs={"num_operands": args.num_operands, "max_value": args.max_value},
        **agent_kwargs(args))
    times["demos"] = time.perf_counter() - t

    t = time.perf_counter()
    sft_log: list[tuple[int, float, float]] = []
    settings = SFTSettings(steps=args.sft_steps, lr=args.sft_lr, batch_size=args.sft_batch,
                           seed=seed, warmup_steps=args.sft_warmup)
    warm = sft(base, demos, settings, out_dir=work / "warm",
               callback=lambda s: sft_log.append((s.step, round(s.loss, 4),
                                                  round(s.token_accuracy, 3))))
    times["sft"] = time.perf_counter() - t
    result["sft_log"] = sft_log[:: max(1, len(sft_log) // 10)] + sft_log[-1:]

    return asyncio.run(_rl(args, seed, warm, tokenizer, result, times, t0, work))


async def _rl(args, seed, warm, tokenizer, result, times, t0, work) -> dict[str, Any]:
    backend = HFBackend(warm, max_batch_size=args.concurrency, seed=seed)
    sample_seed = 10_000_000 * (seed + 1)
    try:
        t = time.perf_counter()
        warm_rollouts = await play(backend, tokenizer, args, args.eval_episodes,
                                   env_seed=EVAL_SEED, sample_seed=sample_seed,
                                   concurrency=args.concurrency)
        times["eval_warm"] = time.perf_counter() - t
        warm_summary = EpisodeSummary.of(warm_rollouts)
        result["warm_success"] = warm_summary.success_rate
        result["warm_failures"] = failure_modes(warm_rollouts)
        print(f"[seed {seed}] warm start: success {warm_summary.success_rate:.3f} "
              f"{result['warm_failures']}", file=sys.stderr, flush=True)

        t = time.perf_counter()
        config = LearnerConfig(
            lr=args.lr, critic_lr=args.critic_lr, eps_low=args.eps_low, eps_high=args.eps_high,
            aggregation=args.aggregation, critic_updates=args.critic_updates,
            critic_warmup_steps=args.critic_warmup,
            critic_freeze=None if args.critic_freeze == "none" else args.critic_freeze,
            max_grad_norm=args.max_grad_norm, seed=seed,
            running_mean_per_prompt=False, running_mean_window=128)
        learner = build_learner(args.algorithm, warm, config)
        if args.pretrain_critic:
            ev = learner.pretrain_critic(warm_rollouts, args.pretrain_critic)
            result["pretrain_critic_ev"] = [round(x, 3) for x in ev]
        times["learner_build"] = time.perf_counter() - t

        history: list[dict[str, Any]] = []
        t_play = t_learn = t_eval = 0.0
        for step in range(args.rl_steps):
            t = time.perf_counter()
            batch = await play(backend, tokenizer, args, args.batch_size,
                               env_seed=TRAIN_SEED + 10_000 * seed + step * args.batch_size,
                               sample_seed=sample_seed + 1_000_000 + step * args.batch_size,
                               concurrency=args.batch_size)
            t_play += time.perf_counter() - t
            t = time.perf_counter()
            train = [r for r in batch if not r.infra_failure]
            if args.lr_warmup:  # each model's lr rises from its own first update
                policy_step = step - (args.critic_warmup if learner.critic is not None else 0)
                for opt, lr, k in ((learner.policy_opt, config.lr, policy_step),
                                   (learner.critic_opt, config.critic_lr or 5 * config.lr, step)):
                    for group in opt.param_groups if opt is not None else []:
                        group["lr"] = lr * min(1.0, max(k + 1, 1) / args.lr_warmup)
            metrics = await asyncio.to_thread(learner.update, train)
            await backend.update_weights(learner.policy.state_dict(), learner.policy_version)
            t_learn += time.perf_counter() - t
            row = {
                "step": step + 1,
                "reward": round(sum(r.reward for r in batch) / len(batch), 3),
                "ev": round(metrics.get("critic/explained_variance", float("nan")), 3),
                "clip": round(metrics.get("sao/clip_ratio", float("nan")), 4),
                "kl": round(metrics.get("sao/approx_kl", float("nan")), 4),
                "ratio_max": round(metrics.get("sao/ratio_max", float("nan")), 3),
                "entropy": round(metrics.get("policy/entropy", float("nan")), 3),
                "adv_mean": round(metrics["advantage/mean"], 3),
                "adv_std": round(metrics["advantage/std"], 3),
                "value_mean": round(metrics.get("critic/value_mean", float("nan")), 3),
                "pg_norm": round(metrics.get("policy/grad_norm", float("nan")), 3),
                "len": round(sum(r.num_action_tokens for r in batch) / len(batch), 1),
            }
            if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.rl_steps:
                t = time.perf_counter()
                mid = await play(backend, tokenizer, args, args.mid_eval_episodes,
                                 env_seed=EVAL_SEED, sample_seed=sample_seed,
                                 concurrency=args.concurrency)
                t_eval += time.perf_counter() - t
                row["eval_success"] = EpisodeSummary.of(mid).success_rate
            history.append(row)
            if args.verbose or "eval_success" in row:
                print(f"[seed {seed}] {row}", file=sys.stderr, flush=True)
        times["rl_play"], times["rl_learn"], times["rl_mid_eval"] = t_play, t_learn, t_eval
        result["history"] = history

        t = time.perf_counter()
        final = await play(backend, tokenizer, args, args.eval_episodes, env_seed=EVAL_SEED,
                           sample_seed=sample_seed, concurrency=args.concurrency)
        times["eval_final"] = time.perf_counter() - t
        final_summary = EpisodeSummary.of(final)
        result["final_success"] = final_summary.success_rate
        result["final_failures"] = failure_modes(final)
        result["gain"] = result["final_success"] - result["warm_success"]
        if args.out:
            learner.save_models(work / "final")
    finally:
        await backend.aclose()
    times["total"] = time.perf_counter() - t0
    result["times_s"] = {k: round(v, 1) for k, v in times.items()}
    print(f"[seed {seed}] warm {result['warm_success']:.3f} -> final "
          f"{result['final_success']:.3f} (gain {result['gain']:+.3f}); "
          f"{result['times_s']}", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    seeds = args.seeds if args.seeds else [args.seed]
    results = []
    for seed in seeds:
        if args.out:
            work = args.out / f"seed{seed}"
            work.mkdir(parents=True, exist_ok=True)
            results.append(run_one(args, seed, work))
            (work / "result.json").write_text(json.dumps(results[-1], indent=1))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                results.append(run_one(args, seed, Path(tmp)))
    summary: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v)
                                        for k, v in vars(args).items()},
                               "runs": results}
    if len(results) > 1:
        summary["median"] = {
            k: statistics.median(r[k] for r in results)
            for k in ("warm_success", "final_success", "gain")
        }
        summary["median"]["total_s"] = statistics.median(r["times_s"]["total"] for r in results)
    print(json.dumps(summary, indent=1, default=lambda o: asdict(o)))


if __name__ == "__main__":
    main()
