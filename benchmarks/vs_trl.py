"""TRL's GRPOTrainer against `sao-gym train` (SAO) on TRL's own kind of task, side by side.

The task is TRL's textbook single-turn one: the user asks ``What is {a} {op} {b}?
Answer with the number in <answer></answer>.`` (a, b in 1..20, op + or -: 800
problems). A seeded shuffle (fixed, :data:`SPLIT_SEED`) sets 200 of them aside as
the held-out set, never trained on; both trainers draw from the other 600. The
reward is 1.0 for ``<answer>N</answer>`` with the right N, 0.1 for the tags around a
wrong or unparseable number, 0 without the tags (:func:`vs_trl_task.score`, shared by
both sides: the TRL runner, benchmarks/vs_trl_runner.py, imports it).

One invocation, every part in sequence so each has the whole CPU:

1. **Warm start** (``OUT/warm``): a random 4.2M-parameter Qwen2
   (:func:`sao_gym.models.tiny_model`, 256 wide, 4 layers, seed ``--seed``, the
   default ChatML template) is fine-tuned on oracle demonstrations
   ``<answer>{result}</answer>`` of training problems
   (:func:`~sao_gym.runtime.prepare.demonstrations.collect_demonstrations` and
   :func:`~sao_gym.learner.sft.sft`), stopping once its teacher-forced greedy
   success on held-out demonstrations reaches 25% (AdamW, lr 1e-3, weight decay 0.1:
   measured, held-out greedy success stays at 3-7% for 600 steps while the training
   problems are memorised, then rises to ~25% by step 900-1,200; without weight decay
   at lr 2e-3 it was 7% after 600 steps). Its real greedy accuracy on all
   200 held-out problems (:func:`evaluate_greedy`: HF ``generate``, greedy, 40 new
   tokens) is the "before" of both sides.
2. **Learning-rate sweep** (``OUT/runs/sweep-*``): each lr of ``--lrs-trl`` and of
   ``--lrs-sao`` trains ``--sweep-minutes`` from the warm checkpoint; each side
   keeps the lr whose run ends with the best greedy held-out accuracy (ties: the
   first). ``--sweep-minutes 0`` skips it and takes the first lr of each list.
3. **Final runs** (``OUT/runs/final-*``): each side trains ``--minutes`` of wall
   clock with its lr from the same warm checkpoint; then greedy held-out accuracy
   again.
4. **Report**: ``OUT/results.json`` and ``OUT/table.md`` (also printed): per side the
   lr, learner steps, completions/s and generated tokens/s over the training loop,
   peak RSS of the training process, greedy held-out accuracy before -> after and
   the gain, greedy accuracy on the first 200 training problems before -> after
   (held-out falling while this rises is memorisation), SAO's median learner step
   split into policy and critic time; and the two targets: SAO's gain minus TRL's
   (>= +10 points) and SAO's completions/s over TRL's (>= 0.75).

The two sides, on the same footing: both sample at temperature 1 from the full
softmax (no top-k or top-p), at most 40 new tokens, 64 completions per learner step,
fp32 on the CPU, constant learning rate, gradient clipping at 1.0, the same prompt
tokens (both render the ChatML template with no tools), the same torch thread
count (``--threads``, else the environment's ``OMP_NUM_THREADS``, else torch's
default). Each trains in its own process (so peak RSS is its own), and the clock
runs from the start of its training loop (model loading excluded) until the first
learner step that ends past the budget.

- **TRL**: ``GRPOTrainer`` from ``trl==1.16.0`` in a scratch venv (``--trl-venv``,
  default ``~/.cache/sao-gym/trl-venv``, created once: torch 2.13.0 first, then
  trl, whose dependencies bring transformers), run by ``benchmarks/vs_trl_runner.py``
  (its settings are listed there): one step is 8 prompts x 8 completions.
- **SAO**: ``sao-gym train``'s trainer built in-process
  (:func:`sao_gym.runtime.config.build.build_trainer`) from a config file written to the
  run directory (``sao.yaml``): algorithm sao, mode async, batch 64 single rollouts,
  64 concurrent episodes, warm start none, no evaluation episodes (the greedy
  evaluation here replaces it), critic warm-up 0, ``learner.critic_layers`` from
  ``--sao-critic-layers`` (default: the full-size critic); a metric sink stops the trainer
  once the budget is spent (the trainer then checkpoints). The environment is
  ``vs_trl/Arith-v0`` (:class:`ArithEnv`, defined and registered below), named
  ``vs_trl:vs_trl/Arith-v0`` so that any process with ``benchmarks/`` on its
  ``PYTHONPATH`` (``sao-gym train``, ``sao-gym check``) finds it.

Every finished part (warm start, each sweep run, each final run) leaves its
``result.json`` and is not redone when the command runs again; an interrupted warm
start goes on from its last saved state (``OUT/warm/state``, saved every 10 minutes);
an unfinished training run is started over. Logs of the training processes: ``OUT/logs/``.

Run (on a quiet machine: the warm start takes at most ``--warm-max-steps`` (4,000)
supervised steps of 0.5-0.8 s each, then come 6 x 3 minutes of sweep and 2 x 10
minutes of final runs, each with a few seconds of set-up and evaluation)::

    .venv/bin/python benchmarks/vs_trl.py --out runs/vs-trl

A quick smoke of every part (numbers meaningless)::

    .venv/bin/python benchmarks/vs_trl.py --out /tmp/vs-trl-smoke --minutes 0.3 --sweep-minutes 0
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium
from _record import provenance
from _runs import child_env, peak_rss_mb, read_json, run_logged, say, torch_threads, write_json
from vs_trl_task import MAX_NEW_TOKENS, make_task, score, split_size, split_task, split_tasks

import sao_gym
from sao_gym.core import StepResult

HERE = Path(__file__).resolve().parent
ENV_ID = "vs_trl/Arith-v0"
ENV_MODULE = "vs_trl"
QUALIFIED_ENV_ID = f"{ENV_MODULE}:{ENV_ID}"
"""The id training uses: importing ``vs_trl`` (this file) registers :data:`ENV_ID`."""

GENERATIONS = 8
"""TRL completions per prompt; the SAO batch holds the same 64 completions per step."""
BATCH = 64
TRL_VERSION, TORCH_VERSION = "1.16.0", "2.13.0"
DEFAULT_VENV = Path.home() / ".cache" / "sao-gym" / "trl-venv"

WARM = {"episodes": 2400, "holdout_episodes": 200, "lr": 1e-3, "weight_decay": 0.1,
        "batch_size": 32, "warmup_steps": 100, "target_success": 0.25, "check_every": 50}
"""The supervised warm start (``--warm-max-steps`` caps its steps)."""

TARGET_GAIN_POINTS = 10.0
TARGET_THROUGHPUT_RATIO = 0.75


# ---------- the environment (the task itself: vs_trl_task.py) ----------


class ArithEnv(sao_gym.AgentEnv):
    """One question, one answer: the first assistant turn ends the episode with its reward.

    Tasks are drawn from ``split`` ("train" or "heldout", also a reset option) with
    ``self.np_random``; ``options={"task": {"a": 3, "op": "+", "b": 4}}`` fixes one.
    No tools: the prompt renders as plain chat.
    """

    def __init__(self, split: str = "train"):
        super().__init__()
        split_size(split)  # validates
        self.split = split

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[dict], dict[str, Any]]:
        if "task" in options:
            task = options["task"]
            if not isinstance(task, dict) or not {"a", "op", "b"} <= set(task):
                raise ValueError('options["task"] must be a dict with "a", "op" and "b"')
            self.task = make_task(task["a"], task["op"], task["b"])
        else:
            split = str(options.get("split", self.split))
            self.task = split_task(split, int(self.np_random.integers(split_size(split))))
        return [{"role": "user", "content": self.task["prompt"]}], {"task_id": self.task["id"]}

    async def on_step(self, action: dict[str, Any]) -> StepResult:
        assert self.task is not None
        content = action.get("content")
        reward = score(content if isinstance(content, str) else "", self.task["answer"])
        verdict = "Correct." if reward == 1.0 else "Wrong."
        return [{"role": "user", "content": verdict}], reward, True, False, {
            "correct": reward == 1.0}


def answer_oracle(messages: Any, task: Any) -> str:
    """The demonstration of a task: the right answer in its tags."""
    return f"<answer>{task['answer']}</answer>"


if ENV_ID not in gymnasium.registry:  # this file may run as __main__ and be imported as vs_trl
    sao_gym.register(ENV_ID, f"{ENV_MODULE}:ArithEnv", max_episode_steps=1)


# ---------- greedy evaluation ----------


TRAINED_PROBLEMS = 200
"""Training problems scored alongside the held-out set (the first of the fixed order)."""


def evaluate_greedy(model_dir: str | Path, split: str = "heldout") -> dict[str, Any]:
    """Greedy accuracy of a checkpoint on the 200 held-out problems (HF ``generate``).

    ``split="train"``: on the first :data:`TRAINED_PROBLEMS` training problems instead,
    the ones both trainers draw from (held-out accuracy falling while this rises is
    the policy memorising answers rather than learning the arithmetic).
    Prompts are rendered as the agent renders them (the checkpoint's chat template,
    no tools, generation prompt) and batched by length (no padding); each completion
    is cut at the first end-of-turn token and scored with :func:`score`.
    """
    import torch

    from sao_gym.models import load_policy

    model, tokenizer = load_policy(model_dir)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups: dict[int, list[tuple[list[int], dict]]] = defaultdict(list)
    tasks = split_tasks(split)
    for task in tasks[:TRAINED_PROBLEMS] if split == "train" else tasks:
        text = tokenizer.apply_chat_template([{"role": "user", "content": task["prompt"]}],
                                             add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        groups[len(ids)].append((ids, task))
    rewards, samples = [], []
    with torch.inference_mode():
        for group in groups.values():
            ids = torch.tensor([g[0] for g in group])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                                 eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
            for row, (_, task) in zip(out[:, ids.shape[1]:].tolist(), group, strict=True):
                row = row[:row.index(eos)] if eos in row else row
                text = tokenizer.decode(row, skip_special_tokens=False)
                rewards.append(score(text, task["answer"]))
                if len(samples) < 5:
                    samples.append({"prompt": task["prompt"], "completion": text})
    n = len(rewards)
    return {"model": str(model_dir), "episodes": n,
            "accuracy": sum(r == 1.0 for r in rewards) / n,
            "tagged": sum(r > 0 for r in rewards) / n,
            "mean_reward": sum(rewards) / n, "samples": samples}


def cached_eval(model_dir: str | Path, path: Path, split: str = "heldout") -> dict[str, Any]:
    """:func:`evaluate_greedy`, kept in ``path``."""
    if not path.exists():
        write_json(path, evaluate_greedy(model_dir, split))
    return read_json(path)


# ---------- warm start ----------


def warm_start(out: Path, seed: int, max_steps: int, weight_decay: float = WARM["weight_decay"]
               ) -> dict[str, Any]:
    """The shared warm checkpoint (``OUT/warm/model``) and its greedy held-out accuracy.

    ``weight_decay`` 0 is plain SFT (AdamW without decay); a warm start kept in
    ``OUT`` with another weight decay is refused rather than reused.
    """
    part = out / "warm"
    if (part / "result.json").exists():
        kept = read_json(part / "result.json")
        if kept.get("weight_decay", WARM["weight_decay"]) != weight_decay:
            raise SystemExit(f"{part} was warm-started with weight decay "
                             f"{kept.get('weight_decay', WARM['weight_decay'])}, not "
                             f"{weight_decay}: use another --out")
        return _with_trained_eval(part, kept)
    from transformers import AutoTokenizer

    from sao_gym.learner.sft import SFTSettings, SFTStep, sft
    from sao_gym.models import tiny_model
    from sao_gym.runtime.prepare.demonstrations import collect_demonstrations

    base = tiny_model(part / "base", hidden_size=256, num_layers=4, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(base)

    def demos(split: str, episodes: int, first_seed: int) -> list:
        return collect_demonstrations(
            QUALIFIED_ENV_ID, tokenizer, answer_oracle, episodes=episodes, seed=first_seed,
            env_kwargs={"split": split}, max_new_tokens=MAX_NEW_TOKENS, max_context_tokens=512)

    train = demos("train", WARM["episodes"], 10_000_000 + seed)
    holdout = demos("heldout", WARM["holdout_episodes"], 20_000_000 + seed)
    say(f"warm start: {len(train)} demonstrations of training problems, at most {max_steps} "
        f"steps, until teacher-forced greedy held-out success >= {WARM['target_success']}")
    last: dict[str, Any] = {}

    def progress(s: SFTStep) -> None:
        last.update(steps=s.step, loss=s.loss, holdout_greedy=s.holdout_greedy)
        if s.step % 100 == 0 or (s.holdout_success or 0) >= WARM["target_success"]:
            say(f"  sft step {s.step}: loss {s.loss:.3f}, token accuracy {s.token_accuracy:.3f}"
                f", held-out greedy {s.holdout_greedy} ({s.elapsed_s:.0f} s)")

    start = time.monotonic()
    settings = SFTSettings(steps=max_steps, lr=WARM["lr"], batch_size=WARM["batch_size"],
                           weight_decay=weight_decay,
                           warmup_steps=min(WARM["warmup_steps"], max_steps // 2), seed=seed,
                           log_every=0, target_success=WARM["target_success"],
                           target_metric="greedy", check_every=WARM["check_every"])
    model = sft(base, train, settings, out_dir=part / "model", callback=progress,
                holdout=holdout, state_dir=part / "state")
    if (last.get("holdout_greedy") or 0.0) < WARM["target_success"]:
        say(f"warm start: the target was not reached in {max_steps} steps (held-out greedy "
            f"{last.get('holdout_greedy')}); going on from there (--warm-max-steps raises it)")
    result = {"model": model, "weight_decay": weight_decay,
              "sft_seconds": round(time.monotonic() - start, 1), **last,
              "eval": evaluate_greedy(model)}
    write_json(part / "result.json", result)
    shutil.rmtree(part / "state", ignore_errors=True)
    return _with_trained_eval(part, result)


def _with_trained_eval(part: Path, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with ``eval_trained``: the checkpoint's accuracy on trained problems."""
    return {**result, "eval_trained": cached_eval(result["model"], part / "eval_trained.json",
                                                  "train")}


# ---------- the SAO side (a worker process: this file with --sao-worker SPEC) ----------


def sao_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The `sao-gym train` config of a run (written to RUN_DIR/sao.yaml)."""
    return {
        "algorithm": "sao", "mode": "async", "env": QUALIFIED_ENV_ID,
        "env_kwargs": {"split": "train"}, "model": spec["model"],
        "total_steps": 1_000_000,  # a stop condition only: the budget ends the run
        "seed": spec["seed"],
        "rollout": {"batch_size": BATCH, "group_size": 1, "concurrency": BATCH,
                    "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0,
                    "max_context_tokens": 512},
        "inference": {"backend": "hf", "max_batch_size": BATCH},
        "learner": {"lr": spec["lr"], "critic_warmup_steps": 0, "seed": spec["seed"],
                    "critic_layers": spec.get("critic_layers")},
        "warm_start": None,
        "eval": {"episodes": 0},
        "checkpoint": {"every": 0, "keep": 1},
        "logging": {"loggers": "jsonl"},
    }


STEP_TIMES = ("learner/step_time_s", "learner/policy_time_s", "learner/critic_time_s")
"""The learner's per-step timings the SAO side records (medians in train.json)."""


class _Deadline:
    """A metric sink: records each step's mean reward, stops the trainer past the budget."""

    def __init__(self, seconds: float):
        self.seconds, self.trainer, self.start = seconds, None, time.monotonic()
        self.rewards: list[float] = []
        self.times: dict[str, list[float]] = {k: [] for k in STEP_TIMES}

    def log(self, step: int, metrics: Any) -> None:
        self.rewards.append(round(float(metrics.get("rollout/return_mean", 0.0)), 4))
        for key, values in self.times.items():
            if key in metrics:
                values.append(float(metrics[key]))
        elapsed = time.monotonic() - self.start
        if step % 10 == 0 or elapsed >= self.seconds:
            say(f"sao step {step}: mean reward {self.rewards[-1]:.3f}, {elapsed:.0f} s")
        if elapsed >= self.seconds and self.trainer is not None:
            self.trainer.request_stop()

    def close(self) -> None:
        pass


def sao_worker(spec_path: Path) -> None:
    """Train SAO for the spec's wall-clock budget; write RUN_DIR/train.json."""
    import yaml

    from sao_gym.runtime.config.build import build_trainer
    from sao_gym.runtime.config.loader import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = read_json(spec_path)
    run_dir = Path(spec["run_dir"])
    (run_dir / "sao.yaml").write_text(yaml.safe_dump(sao_config(spec), sort_keys=False))
    config = load_config(run_dir / "sao.yaml")
    deadline = _Deadline(spec["seconds"])
    trainer = build_trainer(config, run_dir, policy_path=spec["model"], sinks=[deadline])
    deadline.trainer = trainer
    deadline.start = time.monotonic()
    last = trainer.run()
    if last is None:
        raise SystemExit("the SAO run ended without a checkpoint")
    counters = trainer.source.counters
    write_json(run_dir / "train.json", {
        "steps": trainer.learner.steps_done, "completions": counters.delivered,
        "generated_tokens": counters.action_tokens, "wall_s": round(trainer.loop_seconds, 2),
        "peak_rss_mb": peak_rss_mb(), "policy": str(last / "policy"),
        "train_rewards": deadline.rewards, "torch_threads": torch_threads(),
        "step_times_median_s": {k.split("/")[1]: round(statistics.median(v), 4)
                                for k, v in deadline.times.items() if v}})


def train_sao(spec: dict[str, Any], log: Path, threads: int | None) -> None:
    spec_path = Path(spec["run_dir"]) / "spec.json"
    write_json(spec_path, spec)
    run_logged([sys.executable, str(Path(__file__).resolve()), "--sao-worker", str(spec_path)],
               log, child_env(threads), "the SAO training run")


# ---------- the TRL side (a runner script in the TRL venv) ----------


def _trl_ready(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import torch, trl; print(trl.__version__, torch.__version__.split('+')[0])"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          check=False)
    return done.returncode == 0 and done.stdout.split() == [TRL_VERSION, TORCH_VERSION]


def ensure_trl_venv(venv: Path, log: Path) -> Path:
    """The TRL venv's python: ``python3 -m venv``, then torch, then trl (once)."""
    python = venv / "bin" / "python"
    if _trl_ready(python):
        return python
    say(f"creating the TRL venv {venv} (takes a few minutes; pip's output: {log})")
    base = shutil.which("python3") or sys.executable
    pip = str(venv / "bin" / "pip")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # torch first: with torch already there, trl does not pull a CUDA build of it.
    for cmd, what in (([base, "-m", "venv", str(venv)], f"creating the venv {venv}"),
                      ([pip, "install", f"torch=={TORCH_VERSION}"], f"pip install torch in {venv}"),
                      ([pip, "install", f"trl=={TRL_VERSION}"], f"pip install trl in {venv}")):
        run_logged(cmd, log, env, what)
    if not _trl_ready(python):
        raise SystemExit(f"{venv} was set up but does not import trl {TRL_VERSION} with torch "
                         f"{TORCH_VERSION}; remove it and retry (pip's output: {log})")
    return python


def train_trl(spec: dict[str, Any], log: Path, threads: int | None, python: Path) -> None:
    run_dir = Path(spec["run_dir"])
    runner = HERE / "vs_trl_runner.py"
    spec = {**spec, "tasks": split_tasks("train"), "batch": BATCH, "generations": GENERATIONS,
            "max_new_tokens": MAX_NEW_TOKENS}
    write_json(run_dir / "spec.json", spec)
    run_logged([str(python), str(runner), str(run_dir / "spec.json")], log, child_env(threads),
               "the TRL training run")


# ---------- runs, sweep, report ----------


def run_part(args: argparse.Namespace, side: str, phase: str, lr: float, minutes: float,
             warm: dict[str, Any], python: Path | None) -> dict[str, Any]:
    """One training run of ``side`` ("trl" or "sao") and its greedy held-out accuracy."""
    name = f"{phase}-{side}-lr{lr:g}"
    if side == "sao" and args.sao_critic_layers is not None:
        name += f"-critic{args.sao_critic_layers}L"
    seed = args.final_seed if phase == "final" else args.seed
    name += f"-seed{seed}" if seed != args.seed else ""
    run_dir = args.out / "runs" / name
    if (run_dir / "result.json").exists():
        return read_json(run_dir / "result.json")
    if not (run_dir / "train.json").exists():
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished run starts over
        run_dir.mkdir(parents=True)
        say(f"{name}: training {minutes:g} min from the warm checkpoint")
        spec = {"run_dir": str(run_dir), "model": warm["model"], "lr": lr,
                "seconds": minutes * 60, "seed": seed,
                "critic_layers": args.sao_critic_layers}
        log = args.out / "logs" / f"{name}.log"
        if side == "sao":
            train_sao(spec, log, args.threads)
        else:
            assert python is not None
            train_trl(spec, log, args.threads, python)
    train = read_json(run_dir / "train.json")
    after = cached_eval(train["policy"], run_dir / "eval.json")
    trained = cached_eval(train["policy"], run_dir / "eval_trained.json", "train")
    before = warm["eval"]["accuracy"]
    wall = max(train["wall_s"], 1e-9)
    result = {"name": name, "side": side, "phase": phase, "lr": lr, "minutes": minutes,
              **{k: train[k] for k in ("steps", "completions", "generated_tokens", "wall_s",
                                       "peak_rss_mb", "policy", "torch_threads")},
              "completions_per_s": round(train["completions"] / wall, 3),
              "tokens_per_s": round(train["generated_tokens"] / wall, 2),
              "accuracy_before": before, "accuracy_after": after["accuracy"],
              "gain_points": round(100 * (after["accuracy"] - before), 2),
              "trained_accuracy_before": warm["eval_trained"]["accuracy"],
              "trained_accuracy_after": trained["accuracy"],
              "step_times_median_s": train.get("step_times_median_s", {}),
              "train_rewards_first_last": _first_last(train["train_rewards"])}
    write_json(run_dir / "result.json", result)
    say(f"{name}: {result['steps']} steps, {result['completions_per_s']:.2f} completions/s, "
        f"greedy held-out accuracy {100 * before:.1f}% -> {100 * after['accuracy']:.1f}%")
    return result


def _first_last(values: list[float], n: int = 5) -> list[float | None]:
    """Mean of the first and of the last ``n`` values (None when empty)."""
    if not values:
        return [None, None]
    head, tail = values[:n], values[-n:]
    return [round(sum(head) / len(head), 4), round(sum(tail) / len(tail), 4)]


def choose_lr(args: argparse.Namespace, side: str, lrs: list[float], warm: dict[str, Any],
              python: Path | None) -> tuple[float, list[dict[str, Any]]]:
    """The lr whose sweep run ends most accurate (the first lr without a sweep)."""
    if args.sweep_minutes <= 0:
        return lrs[0], []
    runs = [run_part(args, side, "sweep", lr, args.sweep_minutes, warm, python) for lr in lrs]
    best = max(range(len(runs)), key=lambda i: (runs[i]["accuracy_after"], -i))
    return lrs[best], runs


ROWS = [("lr", "lr", "{:g}"), ("learner steps", "steps", "{}"),
        ("training wall time (s)", "wall_s", "{:.0f}"),
        ("completions/s", "completions_per_s", "{:.2f}"),
        ("generated tokens/s", "tokens_per_s", "{:.1f}"),
        ("peak RSS (MB)", "peak_rss_mb", "{:.0f}")]


def table(trl: dict[str, Any], sao: dict[str, Any], targets: dict[str, Any],
          sweep: list[dict[str, Any]]) -> str:
    """The report as Markdown."""
    lines = ["| | TRL GRPOTrainer | sao-gym train (SAO) |", "|---|---|---|"]
    for label, key, fmt in ROWS:
        lines.append(f"| {label} | {fmt.format(trl[key])} | {fmt.format(sao[key])} |")
    acc = [f"{100 * r['accuracy_before']:.1f}% -> {100 * r['accuracy_after']:.1f}%"
           for r in (trl, sao)]
    lines.append(f"| greedy held-out accuracy | {acc[0]} | {acc[1]} |")
    lines.append(f"| gain (points) | {trl['gain_points']:+.1f} | {sao['gain_points']:+.1f} |")
    if all("trained_accuracy_after" in r for r in (trl, sao)):  # runs kept from before it
        trained = [f"{100 * r['trained_accuracy_before']:.1f}% -> "
                   f"{100 * r['trained_accuracy_after']:.1f}%" for r in (trl, sao)]
        lines.append(f"| greedy accuracy on {TRAINED_PROBLEMS} trained problems | "
                     f"{trained[0]} | {trained[1]} |")
    times = sao.get("step_times_median_s") or {}
    if times:
        lines.append("| SAO learner step, median: total / policy / critic (s) | | "
                     + " / ".join(f"{times.get(k, float('nan')):.2f}"
                                  for k in ("step_time_s", "policy_time_s", "critic_time_s"))
                     + " |")
    lines += ["", "| target | value | goal | met |", "|---|---|---|---|",
              f"| SAO gain - TRL gain (points) | {targets['gain_difference_points']:+.1f} | "
              f">= +{TARGET_GAIN_POINTS:g} | {'yes' if targets['gain_met'] else 'no'} |",
              f"| SAO completions/s / TRL completions/s | {targets['throughput_ratio']:.2f} | "
              f">= {TARGET_THROUGHPUT_RATIO:g} | {'yes' if targets['throughput_met'] else 'no'} |"]
    if sweep:
        lines += ["", "Learning-rate sweep (greedy held-out accuracy after the sweep run):", "",
                  "| side | lr | steps | completions/s | accuracy after |", "|---|---|---|---|---|"]
        lines += [f"| {r['side']} | {r['lr']:g} | {r['steps']} | {r['completions_per_s']:.2f} | "
                  f"{100 * r['accuracy_after']:.1f}% |" for r in sweep]
    return "\n".join(lines) + "\n"


def report(args: argparse.Namespace, warm: dict[str, Any], trl: dict[str, Any],
           sao: dict[str, Any], sweep: list[dict[str, Any]]) -> None:
    gain = round(sao["gain_points"] - trl["gain_points"], 2)
    ratio = round(sao["completions_per_s"] / max(trl["completions_per_s"], 1e-9), 3)
    targets = {"gain_difference_points": gain, "gain_met": gain >= TARGET_GAIN_POINTS,
               "throughput_ratio": ratio, "throughput_met": ratio >= TARGET_THROUGHPUT_RATIO}
    text = table(trl, sao, targets, sweep)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    tag = f"-seed{args.final_seed}" if args.final_seed != args.seed else ""
    write_json(args.out / f"results{tag}.json", {
        "settings": settings, "warm_start": {k: v for k, v in warm.items() if k != "eval"},
        "accuracy_before": warm["eval"]["accuracy"], "trl": trl, "sao": sao,
        "targets": targets, "sweep": sweep, "provenance": provenance()})
    (args.out / f"table{tag}.md").write_text(text)
    print("\n" + text, flush=True)
    say(f"wrote {args.out / f'results{tag}.json'} and {args.out / f'table{tag}.md'}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where every part and the report go")
    p.add_argument("--seed", type=int, default=0, help="model, warm start and both trainers")
    p.add_argument("--final-seed", type=int, default=None,
                   help="trainer seed of the final runs (default --seed): repeats them from "
                        "the same warm start and sweep; report in results-seedN.json")
    p.add_argument("--minutes", type=float, default=10.0, help="training time of each final run")
    p.add_argument("--sweep-minutes", type=float, default=3.0,
                   help="training time of each sweep run (0: no sweep, first lr of each list)")
    p.add_argument("--lrs-trl", type=float, nargs="+", default=[2e-5, 5e-5, 1e-4])
    p.add_argument("--lrs-sao", type=float, nargs="+", default=[2e-5, 5e-5, 1e-4])
    p.add_argument("--trl-venv", type=Path, default=DEFAULT_VENV,
                   help="scratch venv with trl (created when missing)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of both training processes (default: inherited)")
    p.add_argument("--sao-critic-layers", type=int, default=None,
                   help="learner.critic_layers of the SAO side (default: all of the policy's)")
    p.add_argument("--warm-max-steps", type=int, default=4000,
                   help="most supervised warm-start steps")
    p.add_argument("--warm-weight-decay", type=float, default=WARM["weight_decay"],
                   help="AdamW weight decay of the warm start (0: plain SFT)")
    args = p.parse_args(argv)
    args.final_seed = args.seed if args.final_seed is None else args.final_seed
    if args.minutes <= 0 or args.sweep_minutes < 0:
        p.error("--minutes must be > 0 and --sweep-minutes >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--sao-worker"] and len(argv) == 2:
        sao_worker(Path(argv[1]))
        return
    args = parse_args(argv)
    args.out = args.out.resolve()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight bars
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # so that "vs_trl:..." imports this file
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    python = ensure_trl_venv(args.trl_venv.expanduser(), args.out / "logs" / "trl-venv.log")
    warm = warm_start(args.out, args.seed, args.warm_max_steps, args.warm_weight_decay)
    say(f"warm checkpoint {warm['model']}: greedy held-out accuracy "
        f"{100 * warm['eval']['accuracy']:.1f}% ({warm.get('steps')} sft steps)")
    lr_trl, sweep_trl = choose_lr(args, "trl", args.lrs_trl, warm, python)
    lr_sao, sweep_sao = choose_lr(args, "sao", args.lrs_sao, warm, None)
    trl = run_part(args, "trl", "final", lr_trl, args.minutes, warm, python)
    sao = run_part(args, "sao", "final", lr_sao, args.minutes, warm, None)
    report(args, warm, trl, sao, sweep_trl + sweep_sao)


if __name__ == "__main__":
    main()
