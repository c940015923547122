"""TRL's GRPOTrainer against `sao-gym train` (SAO) on a multi-turn tool env with slow tools.

The environment is ``sao_gym/Arithmetic-v0`` (``What is 7 * 3?``; tools
``calculator(expression)`` and ``submit(answer)``, reward 1 for the right answer)
whose every tool call answers after a seeded lognormal delay (median
``--latency-median`` s, sigma ``--latency-sigma``, capped at 5 s), the latency of a
remote tool or a sandbox: :class:`SlowArithmeticEnv`, registered below as
``vs_trl_tools/SlowArithmetic-v0`` (two operands of 0..9, at most 4 turns).

The same model, data and budget on both sides, one side after the other so that
each has the whole CPU:

1. **Warm start** (``OUT/warm``): a random Qwen2 (:func:`sao_gym.models.tiny_model`,
   ``--hidden-size`` wide, ``--layers`` layers) with TRL's copy of the Qwen2.5 chat
   template (``trl.chat_template_utils.qwen2_5_chat_template``: TRL knows how to parse
   its tool calls, and it is prefix-stable, which our ``LLMAgent`` needs) is
   fine-tuned for ``--sft-steps`` supervised steps on the oracle's solution
   (:func:`~sao_gym.envs.arithmetic.oracle.arithmetic_oracle`) written as Hermes tool
   calls: ``calculator`` on the question's expression, ``submit`` of its result,
   then an empty final turn (TRL ends an episode when the model stops calling
   tools; SAO ends it at ``submit``). So the model really calls ~2 tools per
   episode on both sides. The prompt is checked to be token-identical on both
   sides (TRL renders the tools from its methods' signatures, SAO from
   ``info["tools"]``; the env advertises the schemas in the form TRL derives).
2. **Runs** (``OUT/runs/*``), each in its own process of this venv: ``--trajectories``
   N episodes from the warm checkpoint, fp32 on the CPU, temperature 1 (full softmax),
   learning rate ``--lr`` (constant), gradient clipping 1.0, ``--threads`` torch
   threads. With ``--repeats`` R > 1 the order alternates ABBA (TRL, SAO, SAO, TRL, ...).

   - **TRL**: ``GRPOTrainer`` with ``environment_factory`` from our TRL adapter
     (:func:`sao_gym.adapters.trl.environment`), ``per_device_train_batch_size``
     = ``--batch`` B, ``num_generations`` = ``--generations`` G (B/G prompts per
     step), ``max_steps`` N/B, ``beta=0``, ``max_completion_length`` =
     ``--completion-tokens`` (the whole multi-turn completion: sampled and
     tool-result tokens), no activation checkpointing. TRL runs the tool calls of
     a batch one after the other on its main thread.
   - **SAO**: ``sao-gym train``'s trainer built in-process
     (:func:`sao_gym.runtime.config.build.build_trainer`) from ``RUN_DIR/sao.yaml``:
     algorithm sao, mode async, ``rollout.batch_size`` B single rollouts
     (``group_size`` 1), ``total_steps`` N/B, ``concurrency`` ``--sao-concurrency``
     (default 2B) episodes at once, HF backend; ``max_new_tokens`` per turn =
     ``--completion-tokens`` and ``max_context_tokens`` = the longest prompt +
     ``--completion-tokens``, so the whole completion has TRL's budget.

   Each run's clock covers the training loop only (model loading, the warm start
   and the final checkpoint excluded): from TRL's ``on_train_begin`` to its
   ``on_train_end``, SAO's ``Trainer.loop_seconds``. Trajectories/s = the
   trajectories trained on / that wall time (SAO's episodes still in flight when
   the last step ends are not counted, but their compute is in its wall time).
3. **Report**: ``OUT/results.json`` and ``OUT/table.md`` (also printed): per side
   (medians over repeats) trajectories/s, generated tokens/s, tool calls and
   mean reward per trajectory, peak RSS, where the time went (TRL: seconds inside
   tool calls and inside ``generate``; SAO: learner-update seconds and the sum of
   all tool delays, which overlap), and SAO's trajectories/s over TRL's (target >= 2).

Run (about 15 minutes on 2 CPU cores: a 40 s warm start, then 3 x (~3 min of TRL +
~1 min of SAO), each run with ~20 s of process start and model loading)::

    .venv/bin/python benchmarks/vs_trl_tools.py --out runs/vs-trl-tools --threads 2

A quick smoke of every part (numbers meaningless, < 1 minute)::

    .venv/bin/python benchmarks/vs_trl_tools.py --out /tmp/vs-trl-tools-smoke --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import math
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium
from _record import provenance
from _runs import child_env, peak_rss_mb, read_json, run_logged, say, torch_threads, write_json
from vs_trl_tools_warm import warm_start

import sao_gym
from sao_gym.adapters.callables import comparable
from sao_gym.envs.arithmetic.env import ArithmeticEnv

HERE = Path(__file__).resolve().parent
ENV_ID = "vs_trl_tools/SlowArithmetic-v0"
ENV_MODULE = "vs_trl_tools"
QUALIFIED_ENV_ID = f"{ENV_MODULE}:{ENV_ID}"
"""The id both trainers use: importing ``vs_trl_tools`` (this file) registers :data:`ENV_ID`."""

MAX_TURNS = 4
TARGET_RATIO = 2.0

DEFAULTS = {"trajectories": 192, "batch": 16, "generations": 8, "latency_median": 0.4,
            "latency_sigma": 0.5, "hidden_size": 128, "layers": 2, "sft_steps": 200,
            "sft_episodes": 512, "completion_tokens": 128, "repeats": 3}
SMOKE = {"trajectories": 4, "batch": 2, "generations": 2, "latency_median": 0.05,
         "latency_sigma": 0.5, "hidden_size": 64, "layers": 1, "sft_steps": 4,
         "sft_episodes": 16, "completion_tokens": 24, "repeats": 1}
"""``--smoke``: every part runs, on numbers too small to mean anything."""

SFT = {"lr": 3e-3, "batch_size": 4, "slip_rate": 0.3}
"""The warm start: AdamW (learning rate decaying linearly to 10%, clipping 1.0) on
oracle episodes whose submitted answer has a miscopied digit on ``slip_rate`` of them."""

LATENCY = {"calls": 0, "seconds": 0.0}
"""Tool calls run in this process and the sum of their delays (read by the workers)."""


# ---------- the environment ----------


class SlowArithmeticEnv(ArithmeticEnv):
    """``sao_gym/Arithmetic-v0`` whose every tool call answers after a lognormal delay.

    The delays of an episode come from their own generator, seeded at reset from
    ``np_random`` after the task is drawn, so a seed fixes the task and the delay of
    its k-th call. The tools are advertised (``info["tools"]``) in the form TRL
    derives from a Python signature (:func:`~sao_gym.adapters.callables.comparable`:
    no ``additionalProperties``, sorted type lists), so both trainers render the same
    prompt; the env still validates the arguments against its full schemas.
    """

    def __init__(self, *, latency_median_s: float = 0.4, latency_sigma: float = 0.5,
                 max_latency_s: float = 5.0, num_operands: int = 2, max_value: int = 9,
                 operators: str = "+-*"):
        super().__init__(num_operands=num_operands, max_value=max_value, operators=operators)
        if latency_median_s < 0 or latency_sigma < 0 or max_latency_s < 0:
            raise ValueError("latencies must be >= 0")
        self.latency_median_s, self.latency_sigma = latency_median_s, latency_sigma
        self.max_latency_s = max_latency_s
        self._delays = random.Random(0)

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[dict], dict[str, Any]]:
        obs, info = await super().on_reset(options)
        self._delays = random.Random(int(self.np_random.integers(2**62)))
        return obs, info

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [comparable(schema) for schema in super().tool_schemas()]

    def next_delay(self) -> float:
        """The delay of the next tool call, in seconds."""
        if self.latency_median_s == 0:
            return 0.0
        z = self._delays.gauss(0.0, 1.0)
        return min(self.latency_median_s * math.exp(self.latency_sigma * z), self.max_latency_s)

    async def _run_call(self, call: dict[str, Any]) -> Any:
        delay = self.next_delay()
        LATENCY["calls"] += 1
        LATENCY["seconds"] += delay
        await asyncio.sleep(delay)
        return await super()._run_call(call)


if ENV_ID not in gymnasium.registry:  # this file may run as __main__ and as vs_trl_tools
    sao_gym.register(ENV_ID, f"{ENV_MODULE}:SlowArithmeticEnv", max_episode_steps=MAX_TURNS)


def env_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    return {"latency_median_s": spec["latency_median"], "latency_sigma": spec["latency_sigma"]}


# ---------- the TRL side (a worker process: this file with --trl-worker SPEC) ----------


def trl_worker(spec_path: Path) -> None:
    """Train GRPOTrainer on the spec's trajectory budget; write RUN_DIR/train.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sao_gym.adapters.trl import environment

    bench = importlib.import_module(ENV_MODULE)  # the module the env is made from (its LATENCY)

    spec = read_json(spec_path)
    run_dir = Path(spec["run_dir"])
    batch, groups = spec["batch"], spec["generations"]
    steps = spec["trajectories"] // batch
    timing = {"tools_s": 0.0, "generate_s": 0.0}

    class Clock(TrainerCallback):
        start = end = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            say(f"trl step {state.global_step}/{steps}: {time.monotonic() - self.start:.0f} s")

        def on_train_end(self, args, state, control, **kwargs):
            self.end = time.monotonic()

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    first = 1_000_000 * (1 + spec["repeat"])
    env = environment(QUALIFIED_ENV_ID, seeds=range(first, first + spec["trajectories"] // groups),
                      **env_kwargs(spec))
    base = env.environment_factory

    def _call(self: Any, name: str, arguments: dict[str, Any]) -> str:
        t = time.monotonic()
        try:
            return base._call(self, name, arguments)
        finally:
            timing["tools_s"] += time.monotonic() - t

    factory = type(base.__name__, (base,), {"_call": _call})  # times every tool call
    config = GRPOConfig(
        output_dir=str(run_dir / "trl_out"), learning_rate=spec["lr"],
        lr_scheduler_type="constant", warmup_steps=0, max_steps=steps,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1,
        num_generations=groups, max_completion_length=spec["completion_tokens"],
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, max_grad_norm=1.0,
        activation_checkpointing=False, use_cpu=True, bf16=False, fp16=False,
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=spec["seed"] + spec["repeat"])
    clock = Clock()
    trainer = GRPOTrainer(model=model, args=config, train_dataset=env.train_dataset,
                          processing_class=tokenizer, reward_funcs=env.reward_funcs,
                          environment_factory=factory, callbacks=[clock])
    generate = trainer._generate_single_turn

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t = time.monotonic()
        try:
            return generate(*args, **kwargs)
        finally:
            timing["generate_s"] += time.monotonic() - t

    trainer._generate_single_turn = timed_generate
    calls_before, delay_before = bench.LATENCY["calls"], bench.LATENCY["seconds"]
    trainer.train()
    history = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    for pool in trainer._environment_pool.values():
        for instance in pool:
            instance._session.close()
    write_json(run_dir / "train.json", {
        "steps": trainer.state.global_step, "trajectories": trainer.state.global_step * batch,
        "generated_tokens": round(sum(h["completions/mean_length"] * batch for h in history)),
        "tool_calls": round(sum(h["tools/call_frequency"] * batch for h in history)),
        "env_tool_calls": bench.LATENCY["calls"] - calls_before,
        "tool_delay_s": round(bench.LATENCY["seconds"] - delay_before, 2),
        "mean_reward": statistics.mean(h["rewards/env_reward/mean"] for h in history),
        "wall_s": round(clock.end - clock.start, 2), "tools_s": round(timing["tools_s"], 2),
        "generate_s": round(timing["generate_s"], 2), "peak_rss_mb": peak_rss_mb(),
        "torch_threads": torch_threads()})


def train_trl(spec: dict[str, Any], log: Path, threads: int | None) -> None:
    spec_path = Path(spec["run_dir"]) / "spec.json"
    write_json(spec_path, spec)
    run_logged([sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(spec_path)],
               log, child_env(threads), "the TRL training run")


# ---------- the SAO side (a worker process: this file with --sao-worker SPEC) ----------


def sao_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The `sao-gym train` config of a run (written to RUN_DIR/sao.yaml)."""
    batch, concurrency = spec["batch"], spec["concurrency"]
    return {
        "algorithm": "sao", "mode": "async", "env": QUALIFIED_ENV_ID,
        "env_kwargs": env_kwargs(spec), "model": spec["model"],
        "total_steps": spec["trajectories"] // batch,
        "seed": 1_000_000 * (1 + spec["repeat"]) + 500_000,
        "rollout": {"batch_size": batch, "group_size": 1, "concurrency": concurrency,
                    "max_new_tokens": spec["completion_tokens"], "temperature": 1.0,
                    "max_context_tokens": spec["prompt_tokens_max"] + spec["completion_tokens"]},
        "inference": {"backend": "hf", "max_batch_size": concurrency},
        "learner": {"lr": spec["lr"], "critic_warmup_steps": 0,
                    "seed": spec["seed"] + spec["repeat"]},
        "warm_start": None,
        "eval": {"episodes": 0},
        "checkpoint": {"every": 0, "keep": 1},
        "logging": {"loggers": "jsonl"},
    }


class _Steps:
    """A metric sink that prints progress."""

    def __init__(self, total: int):
        self.total, self.start = total, time.monotonic()

    def log(self, step: int, metrics: Any) -> None:
        say(f"sao step {step}/{self.total}: mean reward "
            f"{float(metrics.get('rollout/return_mean', 0.0)):.3f}, "
            f"{time.monotonic() - self.start:.0f} s")

    def close(self) -> None:
        pass


def sao_worker(spec_path: Path) -> None:
    """Train SAO on the spec's trajectory budget; write RUN_DIR/train.json."""
    import yaml

    from sao_gym.runtime.config.build import build_trainer
    from sao_gym.runtime.config.loader import load_config

    bench = importlib.import_module(ENV_MODULE)  # the module the env is made from (its LATENCY)

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    spec = read_json(spec_path)
    run_dir = Path(spec["run_dir"])
    (run_dir / "sao.yaml").write_text(yaml.safe_dump(sao_config(spec), sort_keys=False))
    config = load_config(run_dir / "sao.yaml")
    steps = _Steps(config.total_steps)
    trainer = build_trainer(config, run_dir, policy_path=spec["model"], sinks=[steps])
    seen = {"trajectories": 0, "tool_calls": 0, "reward": 0.0, "turns": 0, "update_s": 0.0}
    update = trainer.learner.update

    def counted_update(batch: list[Any], **kwargs: Any) -> dict[str, float]:
        for rollout in batch:
            seen["trajectories"] += 1
            seen["reward"] += rollout.reward
            assistant = [m for m in rollout.messages if m.get("role") == "assistant"]
            seen["turns"] += len(assistant)
            seen["tool_calls"] += sum(len(m.get("tool_calls") or []) for m in assistant)
        t = time.monotonic()
        try:
            return update(batch, **kwargs)  # trace=: the rollouts the run keeps
        finally:
            seen["update_s"] += time.monotonic() - t

    trainer.learner.update = counted_update
    calls_before, delay_before = bench.LATENCY["calls"], bench.LATENCY["seconds"]
    steps.start = time.monotonic()
    trainer.run()
    counters = trainer.source.counters
    n = max(seen["trajectories"], 1)
    write_json(run_dir / "train.json", {
        "steps": trainer.learner.steps_done, "trajectories": counters.delivered,
        "trained_trajectories": seen["trajectories"],
        "generated_tokens": counters.action_tokens,
        "tool_calls": seen["tool_calls"], "turns": seen["turns"],
        "env_tool_calls": bench.LATENCY["calls"] - calls_before,
        "tool_delay_s": round(bench.LATENCY["seconds"] - delay_before, 2),
        "mean_reward": seen["reward"] / n, "wall_s": round(trainer.loop_seconds, 2),
        "update_s": round(seen["update_s"], 2), "infra_failures": counters.infra_failures,
        "peak_rss_mb": peak_rss_mb(), "torch_threads": torch_threads()})


def train_sao(spec: dict[str, Any], log: Path, threads: int | None) -> None:
    spec_path = Path(spec["run_dir"]) / "spec.json"
    write_json(spec_path, spec)
    run_logged([sys.executable, str(Path(__file__).resolve()), "--sao-worker", str(spec_path)],
               log, child_env(threads), "the SAO training run")


# ---------- runs and report ----------


def run_side(args: argparse.Namespace, cfg: dict[str, Any], side: str, repeat: int,
             warm: dict[str, Any]) -> dict[str, Any]:
    """One training run of ``side`` ("trl" or "sao"), with its derived rates."""
    run_dir = args.out / "runs" / f"{side}-{repeat}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    spec = {"run_dir": str(run_dir), "model": warm["model"], "repeat": repeat,
            "prompt_tokens_max": warm["prompt_tokens_max"], "concurrency": args.sao_concurrency,
            "lr": args.lr, "seed": args.seed,
            **{k: cfg[k] for k in ("trajectories", "batch", "generations", "latency_median",
                                   "latency_sigma", "completion_tokens")}}
    say(f"{side} run {repeat}: {cfg['trajectories']} trajectories from the warm checkpoint")
    log = args.out / "logs" / f"{side}-{repeat}.log"
    log.unlink(missing_ok=True)
    (train_trl if side == "trl" else train_sao)(spec, log, args.threads)
    train = read_json(run_dir / "train.json")
    wall = max(train["wall_s"], 1e-9)
    n = max(train["trajectories"], 1)
    result = {"side": side, "repeat": repeat, **train,
              "trajectories_per_s": round(train["trajectories"] / wall, 3),
              "tokens_per_s": round(train["generated_tokens"] / wall, 1),
              "tool_calls_per_trajectory": round(train["tool_calls"] / n, 3)}
    write_json(run_dir / "result.json", result)
    say(f"{side} run {repeat}: {result['trajectories']} trajectories in {wall:.1f} s = "
        f"{result['trajectories_per_s']:.2f}/s, {result['tool_calls_per_trajectory']:.2f} tool "
        f"calls each, mean reward {result['mean_reward']:.3f}")
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one side: each numeric field's median over repeats."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and k != "repeat"]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


ROWS = [("trajectories", "trajectories", "{:.0f}"), ("learner steps", "steps", "{:.0f}"),
        ("training wall time (s)", "wall_s", "{:.1f}"),
        ("**trajectories/s**", "trajectories_per_s", "**{:.2f}**"),
        ("generated tokens/s", "tokens_per_s", "{:.0f}"),
        ("tool calls / trajectory", "tool_calls_per_trajectory", "{:.2f}"),
        ("mean reward", "mean_reward", "{:.3f}"), ("peak RSS (MB)", "peak_rss_mb", "{:.0f}"),
        ("torch threads", "torch_threads", "{:.0f}")]


def table(trl: dict[str, Any], sao: dict[str, Any], ratio: float, repeats: int) -> str:
    """The report as Markdown."""
    what = f"median of {repeats} runs" if repeats > 1 else "one run"
    lines = [f"| ({what}) | TRL GRPOTrainer | sao-gym train (SAO) |", "|---|---|---|"]
    for label, key, fmt in ROWS:
        lines.append(f"| {label} | {fmt.format(trl[key])} | {fmt.format(sao[key])} |")
    lines.append(f"| time inside tool calls (s) | {trl['tools_s']:.1f} (sequential, "
                 f"{100 * trl['tools_s'] / trl['wall_s']:.0f}% of wall) | "
                 f"{sao['tool_delay_s']:.1f} summed over all episodes (concurrent) |")
    lines.append(f"| time inside generate / learner updates (s) | generate {trl['generate_s']:.1f}"
                 f" ({100 * trl['generate_s'] / trl['wall_s']:.0f}%), the rest "
                 f"{trl['wall_s'] - trl['tools_s'] - trl['generate_s']:.1f} | learner updates "
                 f"{sao['update_s']:.1f} ({100 * sao['update_s'] / sao['wall_s']:.0f}%; "
                 f"sampling runs alongside) |")
    lines += ["", "| target | value | goal | met |", "|---|---|---|---|",
              f"| SAO trajectories/s / TRL trajectories/s | {ratio:.2f} | >= {TARGET_RATIO:g} | "
              f"{'yes' if ratio >= TARGET_RATIO else 'no'} |"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where every part and the report go")
    p.add_argument("--smoke", action="store_true",
                   help=f"tiny numbers for a quick check of every part ({SMOKE})")
    p.add_argument("--trajectories", type=int, help=f"per run (default {DEFAULTS['trajectories']})")
    p.add_argument("--batch", type=int, help=f"trajectories per learner step, both sides "
                                             f"(default {DEFAULTS['batch']})")
    p.add_argument("--generations", type=int,
                   help=f"TRL's num_generations (default {DEFAULTS['generations']})")
    p.add_argument("--latency-median", type=float,
                   help=f"median tool delay, s (default {DEFAULTS['latency_median']})")
    p.add_argument("--latency-sigma", type=float,
                   help=f"lognormal sigma of the delay (default {DEFAULTS['latency_sigma']})")
    p.add_argument("--hidden-size", type=int, help=f"default {DEFAULTS['hidden_size']}")
    p.add_argument("--layers", type=int, help=f"default {DEFAULTS['layers']}")
    p.add_argument("--sft-steps", type=int, help=f"warm start (default {DEFAULTS['sft_steps']})")
    p.add_argument("--sft-episodes", type=int,
                   help=f"oracle episodes of the warm start (default {DEFAULTS['sft_episodes']})")
    p.add_argument("--completion-tokens", type=int,
                   help="token budget of a whole multi-turn completion, both sides "
                        f"(default {DEFAULTS['completion_tokens']})")
    p.add_argument("--repeats", type=int,
                   help=f"runs per side, ABBA order (default {DEFAULTS['repeats']})")
    p.add_argument("--sao-concurrency", type=int, default=None,
                   help="SAO episodes at once (default 2 x batch)")
    p.add_argument("--lr", type=float, default=5e-5, help="both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of both training processes (default: inherited)")
    args = p.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else DEFAULTS)
    for key in cfg:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["seed"] = args.seed
    if cfg["trajectories"] % cfg["batch"] or cfg["batch"] % cfg["generations"]:
        p.error("--trajectories must be a multiple of --batch, --batch of --generations")
    if cfg["generations"] < 2 or cfg["repeats"] < 1:
        p.error("--generations must be >= 2 (GRPO) and --repeats >= 1")
    if args.sao_concurrency is None:
        args.sao_concurrency = 2 * cfg["batch"]
    return args, cfg


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in ("--sao-worker", "--trl-worker"):
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        (sao_worker if argv[0] == "--sao-worker" else trl_worker)(Path(argv[1]))
        return None
    args, cfg = parse_args(argv)
    args.out = args.out.resolve()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # so that "vs_trl_tools:..." imports this file
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    warm = warm_start(args.out, cfg, QUALIFIED_ENV_ID, SFT)
    say(f"warm checkpoint {warm['model']}: {warm['params']} parameters, SFT loss "
        f"{warm['sft_loss']}, prompts of {warm['prompt_tokens_max']} tokens at most")
    runs: dict[str, list[dict[str, Any]]] = {"trl": [], "sao": []}
    for repeat in range(cfg["repeats"]):
        order = ("trl", "sao") if repeat % 2 == 0 else ("sao", "trl")
        for side in order:
            runs[side].append(run_side(args, cfg, side, repeat, warm))
    trl, sao = median_of(runs["trl"]), median_of(runs["sao"])
    ratio = round(sao["trajectories_per_s"] / max(trl["trajectories_per_s"], 1e-9), 3)
    text = table(trl, sao, ratio, cfg["repeats"])
    settings = {**cfg, "lr": args.lr, "sao_concurrency": args.sao_concurrency,
                "threads": args.threads, "smoke": args.smoke}
    results = {"settings": settings, "warm_start": warm, "trl": trl, "sao": sao, "runs": runs,
               "ratio": ratio, "target": TARGET_RATIO, "target_met": ratio >= TARGET_RATIO,
               "provenance": provenance()}
    write_json(args.out / "results.json", results)
    (args.out / "table.md").write_text(text)
    print("\n" + text, flush=True)
    say(f"wrote {args.out / 'results.json'} and {args.out / 'table.md'}")
    return results


if __name__ == "__main__":
    main()
