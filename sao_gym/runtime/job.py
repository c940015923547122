"""The ``sao-gym train`` and ``sao-gym eval`` jobs.

``train``: prepare the model (build the tiny one, convert SmolLM2, or take a
path), optionally warm-start it on oracle demonstrations, evaluate it, run
the :class:`~sao_gym.runtime.trainer.Trainer`, evaluate the result, and plot.
Every artefact lands in the run directory::

    RUN_DIR/config.yaml          the resolved configuration
    RUN_DIR/model/               the starting checkpoint (after any warm start)
    RUN_DIR/metrics.jsonl        one line per learner step
    RUN_DIR/checkpoints/step_N/  atomic checkpoints (policy/ is servable)
    RUN_DIR/eval_before.json, eval_after.json
    RUN_DIR/plots/*.png
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import sao_gym
from sao_gym.runtime.config import TrainConfig

logger = logging.getLogger(__name__)

TINY_MODEL = {"hidden_size": 128, "num_layers": 2}
"""What ``model: tiny`` builds: 0.5M parameters, the compact tool template
(a third of the tokens of JSON tool calls). At this size the supervised warm
start learns to copy numbers within a few hundred steps, and a step costs a
quarter of the 256-wide, 4-layer model's."""

PLOT_SMOOTHING = 0.9
"""EMA weight of the job's curves (the raw values are drawn faint beneath)."""

SMOLLM2_CACHE = Path.home() / ".cache" / "sao_gym" / "smollm2"


def resolve_model(model: str, run_dir: Path, seed: int) -> str:
    """A local checkpoint path for ``tiny``, ``smollm2`` or a path."""
    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, smollm2, tiny_model

    if model == "tiny":
        path = run_dir / "model" / "base"
        if not (path / "config.json").exists():
            tiny_model(str(path), seed=seed, chat_template=COMPACT_TOOLS_TEMPLATE,
                       **TINY_MODEL)
        return str(path)
    if model == "smollm2":
        return smollm2(SMOLLM2_CACHE)
    if not (Path(model) / "config.json").exists():
        raise FileNotFoundError(f"model {model!r} is neither 'tiny', 'smollm2' nor a local "
                                "Hugging Face checkpoint directory")
    return model


def warm_start(config: TrainConfig, base: str, run_dir: Path, *,
               say: Any = logger.info) -> str:
    """Supervised warm start on oracle demonstrations; returns the new checkpoint.

    Progress (loss, token accuracy) goes to ``say`` every tenth of the steps.
    """
    from transformers import AutoTokenizer

    from sao_gym.runtime.build import oracle_for
    from sao_gym.runtime.warmstart import SFTStep, collect_demonstrations, sft

    ws = config.warm_start
    assert ws is not None
    out = run_dir / "model" / "warm_start"
    if (out / "config.json").exists():
        return str(out)
    tokenizer = AutoTokenizer.from_pretrained(base)
    oracle = oracle_for(config.env, **ws.oracle)
    target = ws.target_success

    def demonstrations(episodes: int, seed: int) -> list:
        return collect_demonstrations(
            config.env, tokenizer, oracle, episodes=episodes, seed=seed,
            env_kwargs=config.env_kwargs, max_new_tokens=config.rollout.max_new_tokens,
            max_context_tokens=config.rollout.max_context_tokens)

    demos = demonstrations(ws.episodes, config.seed + 10_000_000)
    holdout = None
    if target is not None:  # rewarded demonstrations of other tasks
        holdout = [r for r in demonstrations(ws.holdout_episodes, config.seed + 20_000_000)
                   if r.reward > 0]
    every = max(1, ws.steps // 10)

    def report(s: SFTStep) -> None:
        reached = s.holdout_success is not None and s.holdout_success >= target
        if s.step % every == 0 or s.step == ws.steps or reached:
            held = ("" if s.holdout_success is None
                    else f", held-out success {s.holdout_sampled:.3f} sampled / "
                         f"{s.holdout_greedy:.3f} greedy")
            say(f"warm start step {s.step}/{ws.steps}: loss {s.loss:.3f}, "
                f"token accuracy {s.token_accuracy:.3f}{held} ({s.elapsed_s:.0f} s)")
        if reached:
            say(f"warm start stopped: held-out {ws.target_metric} success reached the "
                f"target {target}")

    return sft(base, demos, out_dir=str(out), steps=ws.steps, lr=ws.lr,
               batch_size=ws.batch_size, warmup_steps=ws.steps // 20, seed=config.seed,
               callback=report, label_smoothing=ws.label_smoothing,
               holdout=holdout or None, target_success=target if holdout else None,
               target_metric=ws.target_metric)


def evaluate_policy(policy_path: str, env_id: str, episodes: int, *, seed: int = 1_000_000,
                    env_kwargs: dict | None = None, temperature: float = 1.0,
                    max_new_tokens: int = 64, max_context_tokens: int = 2048,
                    max_episode_steps: int | None = None, concurrency: int = 16,
                    max_batch_size: int | None = None) -> dict[str, Any]:
    """Success rate, mean return, mean turns and infra failures of ``episodes`` episodes.

    Seeds start at ``seed`` (by default far from the training stream's). An
    episode whose environment or agent fails counts as an infra failure
    (reported, never averaged in) and the evaluation goes on.
    """
    from transformers import AutoTokenizer

    from sao_gym.agents import LLMAgent
    from sao_gym.evaluation import EpisodeSummary, run_episodes
    from sao_gym.inference.hf import HFBackend

    tokenizer = AutoTokenizer.from_pretrained(policy_path)

    async def play() -> list:
        backend = HFBackend(policy_path, max_batch_size=max_batch_size or concurrency,
                            seed=seed)
        try:
            return await run_episodes(
                lambda: sao_gym.make(env_id, max_episode_steps=max_episode_steps,
                                     **(env_kwargs or {})),
                lambda: LLMAgent(backend, tokenizer, max_new_tokens=max_new_tokens,
                                 temperature=temperature, max_context_tokens=max_context_tokens),
                episodes, concurrency=concurrency, seed=seed)
        finally:
            await backend.aclose()

    start = time.monotonic()
    rollouts = asyncio.run(play())
    summary = EpisodeSummary.of(rollouts).__dict__
    return {**summary, "model": str(policy_path), "env": env_id,
            "env_kwargs": dict(env_kwargs or {}), "seed": seed,
            "temperature": temperature, "elapsed_s": round(time.monotonic() - start, 2)}


def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
          display: Any = None, say: Any = logger.info) -> dict[str, Any]:
    """The whole ``sao-gym train`` job; returns where everything is.

    ``display`` (a :class:`~sao_gym.progress.ProgressDisplay`) gets every
    step's metrics; its clock starts when RL starts, so its ETA counts
    training time only.
    """
    from sao_gym.runtime.build import build_trainer, eval_settings

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    policy = resolve_model(config.model, run_dir, config.seed)
    if config.chat_template is not None:
        from sao_gym.models import with_chat_template

        policy = with_chat_template(policy, config.chat_template, run_dir / "model" / "templated")
    ws = config.warm_start
    if ws is not None and ws.steps and not resume:
        say(f"warm start: at most {ws.steps} supervised steps on {ws.episodes} demonstrations")
        policy = warm_start(config, policy, run_dir, say=say)
    elif (run_dir / "model" / "warm_start" / "config.json").exists():
        policy = str(run_dir / "model" / "warm_start")
    result: dict[str, Any] = {"run_dir": str(run_dir), "start_model": policy}
    settings = eval_settings(config)
    if config.eval.episodes and not (run_dir / "eval_before.json").exists():
        say(f"evaluating the starting model on {config.eval.episodes} episodes")
        before = evaluate_policy(policy, **settings)
        (run_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
    if resume:
        say(_resuming(run_dir))
    say(f"training: {config.algorithm} ({config.mode}), {config.total_steps} steps")
    trainer = build_trainer(config, run_dir, policy_path=policy, resume=resume,
                            sinks=[display] if display is not None else [])
    if display is not None:
        display.begin(trainer.learner.steps_done)
    last = trainer.run()
    result["checkpoint"] = str(last) if last else None
    result["nonfinite_steps"] = trainer.nonfinite_steps
    result.update(steps_done=trainer.learner.steps_done, total_steps=trainer.total_steps,
                  interrupted=trainer.interrupted)
    if trainer.interrupted:
        say(f"interrupted at step {trainer.learner.steps_done} of {trainer.total_steps}: "
            "the trained model is not evaluated")
    elif config.eval.episodes and last is not None:
        say(f"evaluating the trained model on {config.eval.episodes} episodes")
        after = evaluate_policy(str(last / "policy"), **settings)
        (run_dir / "eval_after.json").write_text(json.dumps(after, indent=2))
    for name in ("eval_before", "eval_after"):
        path = run_dir / f"{name}.json"
        if path.exists():
            result[name] = json.loads(path.read_text())
    result["plots"] = [str(p) for p in _plots(run_dir)]
    return result


def _resuming(run_dir: Path) -> str:
    """Where ``--resume`` takes a run up: its latest checkpoint's step."""
    from sao_gym.runtime.checkpoint import CheckpointManager

    done = CheckpointManager(run_dir).complete()
    if not done:
        return f"resuming {run_dir}: no checkpoint yet, so from step 0"
    step, path = done[-1]
    return f"resuming {run_dir} from step {step} (checkpoint {path})"


def _plots(run_dir: Path) -> list[Path]:
    from sao_gym.plotting import plot_runs

    try:
        return plot_runs(run_dir, smooth=PLOT_SMOOTHING)
    except Exception:  # noqa: BLE001 - a plotting problem must not fail a finished run
        logger.exception("plotting failed")
        return []
