"""The ``sao-gym train`` and ``sao-gym eval`` jobs.

``train`` fits the run to its environment, then trains:

1. demonstrations: the env's registered oracle plays them
   (``sao_gym.register(..., oracle=...)``), or ``warm_start.demonstrations``
   names a file of conversations; without either the run starts from the raw
   model and says so;
2. the model: ``tiny`` is built with a tokenizer trained on a general corpus
   plus the env's own text (prompts, tool schemas, demonstrations),
   ``smollm2`` converted once, or a path taken as it is;
3. token budgets left null are fitted to the demonstrations
   (:mod:`sao_gym.runtime.fit`), and the resolved config is saved;
4. a supervised warm start on the demonstrations, an evaluation, the
   :class:`~sao_gym.runtime.trainer.Trainer`, an evaluation of the result, and
   plots.

Every artefact lands in the run directory::

    RUN_DIR/config.yaml          the resolved configuration (fitted budgets included)
    RUN_DIR/model/               the starting checkpoint (after any warm start; an
                                 interrupted warm start's state, which --resume continues)
    RUN_DIR/metrics.jsonl        one line per learner step
    RUN_DIR/checkpoints/step_N/  atomic checkpoints (policy/ is servable)
    RUN_DIR/eval_before.json, eval_after.json
    RUN_DIR/rollouts/            kept rollouts: a sample of each step's, all evaluations'
    RUN_DIR/plots/*.png

``evaluate`` plays a policy as a run's config says (its env and options,
turn limit, token budgets, temperature and inference backend), each episode
seeded, so ``sao-gym eval --run RUN`` repeats the run's own evaluation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao_gym.evaluation import progress_lines
from sao_gym.runtime.config import RUNTIMES, TrainConfig
from sao_gym.runtime.loader import save_config

logger = logging.getLogger(__name__)

EVAL_SEED = 1_000_000
"""First env seed of evaluations (far from the training stream's)."""

DEMO_SEED_OFFSET = 10_000_000
"""Warm-start demonstrations are episodes ``seed + DEMO_SEED_OFFSET + i``."""

HOLDOUT_SEED_OFFSET = 20_000_000
"""... and the held-out ones ``seed + HOLDOUT_SEED_OFFSET + i``."""

CORPUS_EPISODES = 64
"""Episodes whose text trains the tiny model's tokenizer (with the general corpus)."""

PLOT_SMOOTHING = 0.9
"""EMA weight of the job's curves (the raw values are drawn faint beneath)."""

SMOLLM2_CACHE = Path.home() / ".cache" / "sao_gym" / "smollm2"

_COLLECT_NEW_TOKENS = 1024
"""Turn budget while demonstrations are collected for fitting (no budget set)."""


def resolve_model(model: str, run_dir: Path, seed: int, *, corpus: Any = (),
                  options: dict[str, Any] | None = None) -> str:
    """A local checkpoint path for ``tiny``, ``smollm2`` or a path.

    ``tiny`` is built in ``run_dir/model/base`` with ``options``
    (:func:`~sao_gym.models.tiny_model`'s ``hidden_size``, ``num_layers``,
    ``vocab_size``), its tokenizer trained on the general corpus plus
    ``corpus``; an existing one is reused.
    """
    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, smollm2, tiny_model

    if model == "tiny":
        path = run_dir / "model" / "base"
        if not (path / "config.json").exists():
            tiny_model(str(path), seed=seed, chat_template=COMPACT_TOOLS_TEMPLATE,
                       corpus=list(corpus), **(options or {}))
        return str(path)
    if model == "smollm2":
        return smollm2(SMOLLM2_CACHE)
    if not (Path(model) / "config.json").exists():
        raise FileNotFoundError(f"model {model!r} is neither 'tiny', 'smollm2' nor a local "
                                "Hugging Face checkpoint directory")
    return model


# ---------------------------------------------------------------------------
# demonstrations
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Demonstrations:
    """Where a run's demonstrations come from: an oracle or a file of conversations."""

    config: TrainConfig
    oracle: Callable[..., str] | None = None
    conversations: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, config: TrainConfig) -> Demonstrations | None:
        """The run's source; None when its env has no oracle and no file is given."""
        from sao_gym.runtime.build import oracle_for
        from sao_gym.runtime.conversations import load_conversations

        ws = config.warm_start
        if ws is not None and ws.demonstrations is not None:
            return cls(config, conversations=load_conversations(ws.demonstrations))
        oracle = oracle_for(config.env, **(ws.oracle if ws is not None else {}))
        return cls(config, oracle=oracle) if oracle is not None else None

    @property
    def what(self) -> str:
        """In words, for the run's output."""
        if self.conversations is not None:
            path = self.config.warm_start.demonstrations
            return f"{len(self.conversations)} conversations of {path}"
        return f"the oracle registered with {self.config.env}"

    def collect(self, tokenizer: Any, *, episodes: int, holdout: int, budgets: dict[str, int]
                ) -> tuple[list[Any], list[Any]]:
        """``(training, held-out)`` demonstrations as token-exact rollouts."""
        from sao_gym.runtime.build import env_factory
        from sao_gym.runtime.conversations import replay_env_factory, replay_oracle
        from sao_gym.runtime.warmstart import collect_demonstrations

        seed = self.config.seed
        ws = self.config.warm_start
        budgets = {**budgets, "tool_schemas": self.config.rollout.tool_schemas,
                   "template_format": ws is not None and ws.demonstration_format == "template"}
        if self.conversations is not None:
            convs = self.conversations
            held = min(holdout, len(convs) // 4)
            tools = self._env_tools()
            played = collect_demonstrations(replay_env_factory(convs, tools), tokenizer,
                                            replay_oracle, episodes=len(convs), **budgets)
            return played[:len(convs) - held], played[len(convs) - held:]
        make_env = env_factory(self.config)
        train = collect_demonstrations(make_env, tokenizer, self.oracle, episodes=episodes,
                                       seed=seed + DEMO_SEED_OFFSET, **budgets)
        held = (collect_demonstrations(make_env, tokenizer, self.oracle, episodes=holdout,
                                       seed=seed + HOLDOUT_SEED_OFFSET, **budgets)
                if holdout else [])
        return train, held

    def _env_tools(self) -> list[Any]:
        from sao_gym.runtime.build import env_factory

        env = env_factory(self.config)()
        try:
            return list(env.reset(seed=self.config.seed)[1].get("tools") or [])
        finally:
            env.close()


def env_corpus(config: TrainConfig, demos: Demonstrations | None, episodes: int) -> list[str]:
    """Text of the env as the model sees it: ``episodes`` tasks rendered with their tools.

    The tasks are played by the demonstrations' source when there is one.
    It trains the tiny model's tokenizer, so it is rendered with a provisional
    tokenizer of the general corpus (only its chat template matters here).
    """
    import tempfile

    from transformers import AutoTokenizer

    from sao_gym.models import COMPACT_TOOLS_TEMPLATE, _build_tokenizer
    from sao_gym.runtime.build import env_factory

    tokenizer = _build_tokenizer(int((config.model_options or {}).get("vocab_size", 1024)))
    tokenizer.chat_template = COMPACT_TOOLS_TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:  # a reload gives the class the agent uses
        tokenizer.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    make_env = env_factory(config)
    env = make_env()
    try:
        tools = env.reset(seed=config.seed)[1].get("tools") or []
    finally:
        env.close()
    if demos is not None:
        played, _ = demos.collect(tokenizer, episodes=episodes, holdout=0,
                                  budgets={"max_new_tokens": _COLLECT_NEW_TOKENS})
        conversations = [r.messages for r in played]
    else:
        conversations = []
        for i in range(episodes):
            env = make_env()
            try:
                conversations.append(env.reset(seed=config.seed + DEMO_SEED_OFFSET + i)[0])
            finally:
                env.close()
    return [tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
            for messages in conversations]


# ---------------------------------------------------------------------------
# the train job
# ---------------------------------------------------------------------------


def prepare(config: TrainConfig, run_dir: Path, *, say: Any = logger.info
            ) -> tuple[TrainConfig, str]:
    """Fit the run to its env: ``(resolved config, starting checkpoint)``; saves the config.

    Builds or finds the model, collects demonstrations, fits null token
    budgets, and runs the supervised warm start (see the module docs).
    """
    from transformers import AutoConfig, AutoTokenizer

    from sao_gym.runtime.fit import fit_budgets, fit_label_smoothing

    ws = config.warm_start
    demos = Demonstrations.of(config) if ws is not None and ws.steps else None
    if demos is None:
        say(f"no warm start: {config.env} registers no oracle and warm_start.demonstrations "
            "names no file, so RL starts from the raw model"
            if ws is not None and ws.steps else "no warm start (warm_start: null)")
    else:
        say(f"demonstrations: {demos.what}")
    corpus: list[str] = []
    if config.model == "tiny" and not (run_dir / "model" / "base" / "config.json").exists():
        corpus = env_corpus(config, demos, CORPUS_EPISODES)
    policy = base_policy(config, run_dir, corpus)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    positions = getattr(AutoConfig.from_pretrained(policy), "max_position_embeddings", None)
    r = config.rollout
    budgets = {"max_new_tokens": r.max_new_tokens or _COLLECT_NEW_TOKENS,
               "max_context_tokens": r.max_context_tokens or positions}
    train_demos: list[Any] = []
    holdout: list[Any] = []
    if demos is not None:
        started = time.monotonic()
        train_demos, holdout = demos.collect(
            tokenizer, episodes=ws.episodes,
            holdout=ws.holdout_episodes if ws.target_success is not None else 0,
            budgets=budgets)
        rewards = [d.reward for d in train_demos]
        say(f"collected {len(train_demos)} demonstrations (+{len(holdout)} held out), mean "
            f"reward {sum(rewards) / len(rewards):.2f} ({time.monotonic() - started:.0f} s)")
    config, lines = fit_budgets(config, train_demos + holdout, turn_limit=turn_limit(config),
                                model_positions=positions)
    config, more = fit_label_smoothing(config, train_demos)
    for line in lines + more:
        say(line)
    save_config(config, run_dir / "config.yaml")
    if demos is not None:
        rewarded = [d for d in holdout if d.reward > 0]
        _keep_demonstrations(run_dir, train_demos, rewarded)
        policy = warm_start(config, policy, run_dir, train_demos, rewarded, say=say)
    return config, policy


def base_policy(config: TrainConfig, run_dir: Path, corpus: Any = ()) -> str:
    """The run's model before any warm start: built or found, with the config's chat template."""
    policy = resolve_model(config.model, run_dir, config.seed, corpus=corpus,
                           options=config.model_options)
    if config.chat_template is not None:
        from sao_gym.models import with_chat_template

        policy = with_chat_template(policy, config.chat_template, run_dir / "model" / "templated")
    return policy


WARM_STATE = "warm_start.partial"
"""``RUN_DIR/model/<this>``: an unfinished warm start, what ``--resume`` continues: its
demonstrations (:data:`DEMONSTRATIONS`) and :func:`~sao_gym.learner.sft.sft`'s state."""

DEMONSTRATIONS = "demonstrations.pkl"

WARM_SAVE_EVERY_S = 600.0
"""How often a warm start saves its state (a crash loses at most this much of it)."""


def _keep_demonstrations(run_dir: Path, demos: list[Any], holdout: list[Any]) -> None:
    """The warm start's inputs, so that an interrupted one continues on the same data."""
    import pickle

    state = run_dir / "model" / WARM_STATE
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / (DEMONSTRATIONS + ".tmp")
    tmp.write_bytes(pickle.dumps({"demos": demos, "holdout": holdout}))
    tmp.replace(state / DEMONSTRATIONS)


def _resumed_start(config: TrainConfig, run_dir: Path, say: Any) -> tuple[TrainConfig, str]:
    """A resumed run's config and starting checkpoint.

    The warm start's checkpoint; an interrupted warm start is continued first
    (from its saved state, on its kept demonstrations), and one that never began
    is prepared again. Without a warm start, the base model.
    """
    import pickle

    from sao_gym.runtime.checkpoint import CheckpointManager

    warm = run_dir / "model" / "warm_start"
    if (warm / "config.json").exists():
        return config, str(warm)
    kept = run_dir / "model" / WARM_STATE / DEMONSTRATIONS
    if kept.exists():
        inputs = pickle.loads(kept.read_bytes())
        say("the warm start was interrupted: continuing it")
        return config, warm_start(config, base_policy(config, run_dir), run_dir,
                                  inputs["demos"], inputs["holdout"], say=say)
    ws = config.warm_start
    if (ws is not None and ws.steps and not CheckpointManager(run_dir).complete()
            and Demonstrations.of(config) is not None):
        say("the run stopped before its warm start began: preparing it again")
        return prepare(config, run_dir, say=say)
    return config, base_policy(config, run_dir)


def turn_limit(config: TrainConfig) -> int | None:
    """The run's turn limit: ``rollout.max_episode_steps`` or the env's registered one."""
    import gymnasium

    from sao_gym.registration import resolve_id

    if config.rollout.max_episode_steps is not None:
        return config.rollout.max_episode_steps
    return gymnasium.spec(resolve_id(config.env)).max_episode_steps


def warm_start(config: TrainConfig, base: str, run_dir: Path, demos: list[Any],
               holdout: list[Any], *, say: Any = logger.info) -> str:
    """Supervised warm start on ``demos``; returns the new checkpoint.

    With ``warm_start.target_success`` it stops once the held-out estimate
    (``holdout``: rewarded demonstrations of other tasks) reaches it.
    Progress (loss, token accuracy) goes to ``say`` every tenth of the steps.
    """
    from sao_gym.learner.sft import SFTStep, sft

    ws = config.warm_start
    assert ws is not None
    out, state = run_dir / "model" / "warm_start", run_dir / "model" / WARM_STATE
    if (out / "config.json").exists():
        shutil.rmtree(state, ignore_errors=True)
        return str(out)
    target = ws.target_success
    every = max(1, ws.steps // 10)
    say(f"warm start: at most {ws.steps} supervised steps on {len(demos)} demonstrations")

    def report(s: SFTStep) -> None:
        reached = s.reached
        if s.step % every == 0 or s.step == ws.steps or reached:
            held = ("" if s.holdout_success is None
                    else f", held-out success {s.holdout_sampled:.3f} sampled / "
                         f"{s.holdout_greedy:.3f} greedy")
            say(f"warm start step {s.step}/{ws.steps}: loss {s.loss:.3f}, "
                f"token accuracy {s.token_accuracy:.3f}{held} ({s.elapsed_s:.0f} s)")
        if reached:
            floor = ("" if ws.min_sampled_success is None
                     else f" and sampled success the floor {ws.min_sampled_success}")
            say(f"warm start stopped: held-out {ws.target_metric} success reached the "
                f"target {target}{floor}")
        elif s.step == ws.steps and s.holdout_success is not None:
            say(f"warm start: the held-out target was not reached in {ws.steps} steps; "
                "RL starts from this checkpoint (raise warm_start.steps, or lower "
                "warm_start.target_success)")

    path = sft(base, demos, out_dir=str(out), steps=ws.steps, lr=ws.lr,
               batch_size=ws.batch_size, warmup_steps=ws.steps // 20, seed=config.seed,
               callback=report, label_smoothing=ws.label_smoothing,
               holdout=holdout or None, target_success=target if holdout else None,
               target_metric=ws.target_metric, min_sampled=ws.min_sampled_success,
               state_dir=state, save_every_s=WARM_SAVE_EVERY_S)
    shutil.rmtree(state, ignore_errors=True)
    return path


def evaluate(config: TrainConfig, policy_path: str, *, episodes: int | None = None,
             seed: int = EVAL_SEED, run_dir: str | Path | None = None,
             on_done: Callable[[Any], None] | None = None, keep: str | None = None,
             step: int | None = None) -> dict[str, Any]:
    """Success rate, mean return, mean turns and infra failures of ``policy_path``.

    Plays ``episodes`` (default ``eval.episodes``) episodes with env seeds
    from ``seed``, as ``config`` says: its env and options, turn limit, token
    budgets, inference backend and ``eval.temperature`` (default the
    rollout's). Each episode's sampling is seeded by its env seed, so the
    numbers repeat for the same seeds. An episode whose environment or agent
    fails counts as an infra failure (reported, never averaged in); when all
    of them do, :class:`~sao_gym.runtime.source.RolloutsFailing` is raised
    (there is nothing to report).
    ``on_done(rollout)`` is called as each episode ends (progress).
    ``keep``: with ``run_dir``, every episode is kept in that split of the run's
    rollouts (replacing an earlier one of that name; ``step``: the learner
    step of the policy, recorded with them).
    """
    from sao_gym.evaluation import EpisodeSummary, run_episodes
    from sao_gym.runtime.build import rollout_factory

    episodes = config.eval.episodes if episodes is None else episodes
    temperature = config.eval.temperature
    temperature = config.rollout.temperature if temperature is None else temperature
    factory = rollout_factory(config, temperature=temperature)

    async def play() -> list:
        rollouts = factory(policy_path, seed=seed, run_dir=run_dir)
        try:
            return await run_episodes(rollouts.make_env, rollouts.make_agent, episodes,
                                      concurrency=config.rollout.concurrency, seed=seed,
                                      on_done=on_done, seed_agents=True)
        finally:
            await rollouts.aclose()

    start = time.monotonic()
    rollouts = asyncio.run(play())
    if keep is not None and run_dir is not None:
        keep_episodes(config, run_dir, keep, rollouts, policy_path=policy_path, step=step)
    summary = EpisodeSummary.of(rollouts).__dict__
    if rollouts and summary["infra_failures"] == len(rollouts):
        from sao_gym.runtime.source import RolloutsFailing

        raise RolloutsFailing(
            f"evaluating {policy_path}: all {len(rollouts)} episodes failed "
            f"({summary['failure_reasons']}); the log above says why (e.g. no inference "
            "server left)")
    return {**summary, "model": str(policy_path), "env": config.env,
            "env_kwargs": dict(config.env_kwargs), "seed": seed,
            "temperature": temperature, "max_episode_steps": turn_limit(config),
            "max_new_tokens": config.rollout.max_new_tokens,
            "max_context_tokens": config.rollout.max_context_tokens,
            "tool_schemas": config.rollout.tool_schemas,
            "backend": config.inference.backend,
            "elapsed_s": round(time.monotonic() - start, 2)}


def keep_episodes(config: TrainConfig, run_dir: str | Path, split: str, rollouts: list[Any], *,
                  policy_path: str, step: int | None = None) -> None:
    """Keep ``rollouts`` as split ``split`` of the run's rollouts (an earlier one is replaced)."""
    import shutil

    from transformers import AutoTokenizer

    from sao_gym.rollout_store import ROLLOUTS_DIR, check_split
    from sao_gym.runtime.build import rollout_bytes
    from sao_gym.runtime.recorder import record_episodes

    shutil.rmtree(Path(run_dir) / ROLLOUTS_DIR / check_split(split), ignore_errors=True)
    segment, most = rollout_bytes(config)
    record_episodes(run_dir, split, rollouts, step=step,
                    tokenizer=AutoTokenizer.from_pretrained(policy_path),
                    segment_bytes=segment, max_bytes=most)


def train(config: TrainConfig, run_dir: str | Path, *, resume: bool = False,
          display: Any = None, say: Any = logger.info) -> dict[str, Any]:
    """The whole ``sao-gym train`` job; returns where everything is.

    ``display`` (a :class:`~sao_gym.progress.ProgressDisplay`) gets every
    step's metrics; its clock starts when RL starts, so its ETA counts
    training time only. On ``resume`` the config is the run's saved one
    (budgets already fitted); a finished warm start is not run again, an
    interrupted one continues where it was saved.
    """
    from sao_gym.runtime.build import require_env

    require_env(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        config, policy = _resumed_start(config, run_dir, say)
    else:
        config, policy = prepare(config, run_dir, say=say)
    result: dict[str, Any] = {"run_dir": str(run_dir), "start_model": policy}
    if config.eval.episodes and not (run_dir / "eval_before.json").exists():
        say(f"evaluating the starting model on {config.eval.episodes} episodes")
        before = evaluate(config, policy, run_dir=run_dir, step=0,
                          on_done=progress_lines(config.eval.episodes, say),
                          keep="eval_before" if config.logging.eval_rollouts else None)
        (run_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
    if resume:
        say(_resuming(run_dir))
    say(f"training: {config.algorithm} ({config.mode}), {config.total_steps} steps")
    trainer, last = _run_trainer(config, run_dir, policy, resume=resume, display=display,
                                 say=say)
    result["checkpoint"] = str(last) if last else None
    result["nonfinite_steps"] = trainer.nonfinite_steps
    result.update(steps_done=trainer.learner.steps_done, total_steps=trainer.total_steps,
                  interrupted=trainer.interrupted)
    if trainer.interrupted:
        say(f"interrupted at step {trainer.learner.steps_done} of {trainer.total_steps}: "
            "the trained model is not evaluated")
    elif config.eval.episodes and last is not None:
        say(f"evaluating the trained model on {config.eval.episodes} episodes")
        after = evaluate(config, str(last / "policy"), run_dir=run_dir,
                         step=trainer.learner.steps_done,
                         on_done=progress_lines(config.eval.episodes, say),
                         keep="eval_after" if config.logging.eval_rollouts else None)
        (run_dir / "eval_after.json").write_text(json.dumps(after, indent=2))
    for name in ("eval_before", "eval_after"):
        path = run_dir / f"{name}.json"
        if path.exists():
            result[name] = json.loads(path.read_text())
    result["plots"] = [str(p) for p in _plots(run_dir)]
    return result


def _run_trainer(config: TrainConfig, run_dir: Path, policy: str, *, resume: bool,
                 display: Any, say: Any) -> tuple[Any, Path | None]:
    """Build the trainer and run it; ``(trainer, last checkpoint)``.

    On Ray, a learner rank that dies makes the run rebuild itself from its last
    checkpoint (as ``--resume`` would), up to ``ray.max_learner_restarts`` times.
    """
    from sao_gym.runtime.ray.learner import LearnerDied

    restarts = config.ray.max_learner_restarts if config.runtime == "ray" else 0
    while True:
        trainer = build_trainer(config, run_dir, policy_path=policy, resume=resume,
                                sinks=[display] if display is not None else [])
        if display is not None:
            display.begin(trainer.learner.steps_done)
        try:
            return trainer, trainer.run()
        except LearnerDied as e:
            if restarts == 0:
                raise
            restarts -= 1
            resume = True
            say(f"{str(e).split(';')[0]}: restarting from the last checkpoint "
                f"({restarts} restart(s) left). {_resuming(run_dir)}")


def build_trainer(config: TrainConfig, run_dir: str | Path, *, policy_path: str,
                  resume: bool = False, sinks: Any = ()) -> Any:
    """The :class:`~sao_gym.runtime.trainer.Trainer` of ``config`` in ``run_dir``.

    The config becomes the run's factories once
    (:func:`~sao_gym.runtime.build.run_parts`); ``runtime`` picks where they run
    (:data:`~sao_gym.runtime.config.RUNTIMES`). ``policy_path`` is the starting checkpoint; with
    ``resume`` the latest checkpoint wins. A fresh run saves its config.
    """
    import importlib

    from sao_gym.runtime.build import require_env, run_parts

    require_env(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(config, run_dir / "config.yaml")
    module, _, name = RUNTIMES[config.runtime].partition(":")  # the config's table
    place = getattr(importlib.import_module(module), name)
    return place(run_parts(config), run_dir, policy_path=policy_path, resume=resume,
                 sinks=sinks)


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
