"""The run's starting checkpoint, from a :class:`~sao_gym.runtime.plans.PreparePlan`.

:func:`prepare` fits a new run to its environment:

1. demonstrations: the env's registered oracle plays them
   (``sao_gym.register(..., oracle=...)``), or a file of conversations is
   replayed (:class:`~sao_gym.runtime.prepare.demonstrations.Demonstrations`);
   without either the run starts from the raw model and says so;
2. the model (:mod:`sao_gym.runtime.prepare.model`): ``tiny`` is built with a
   tokenizer that also learned the env's text, ``smollm2`` converted once, or
   a path taken as it is;
3. null token budgets and label smoothing are fitted to the demonstrations
   (:mod:`sao_gym.runtime.prepare.fit`): a :class:`~sao_gym.runtime.plans.Budgets`
   record, handed to ``save`` before anything long starts;
4. the supervised warm start (:func:`warm_start`, :func:`~sao_gym.learner.sft.sft`
   with the plan's settings), resumable: its inputs and its training state are
   kept under ``RUN_DIR/model/`` until it finishes.

:func:`resume` is the same for ``--resume``: the finished warm start's
checkpoint, an interrupted one continued, or one that never began prepared again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao_gym.curriculum import Curriculum
from sao_gym.learner.config import SFTSettings
from sao_gym.runtime.plans import Budgets, PreparePlan
from sao_gym.runtime.prepare.demonstrations import Demonstrations
from sao_gym.runtime.prepare.model import COLLECT_NEW_TOKENS, base_policy, env_corpus, needs_corpus

logger = logging.getLogger(__name__)

WARM_STATE = "warm_start.partial"
"""``RUN_DIR/model/<this>``: an unfinished warm start, what ``--resume`` continues: its
demonstrations (:data:`DEMONSTRATIONS`) and :func:`~sao_gym.learner.sft.sft`'s state."""

DEMONSTRATIONS = "demonstrations.pkl"

WARM_START = "warm_start"
"""``RUN_DIR/model/<this>``: the finished warm start's checkpoint."""

WARM_RECORD = "warm_start.json"
"""``RUN_DIR/model/warm_start/<this>``: how the warm start ended (:func:`warm_start`)."""

PROGRESS = "progress.json"
"""``RUN_DIR/model/<WARM_STATE>/<this>``: the last held-out check of an unfinished warm start."""


@dataclass(frozen=True)
class Start:
    """Where a run starts: its checkpoint, its (fitted) budgets and its curriculum level."""

    policy: str
    """The starting checkpoint (after any warm start)."""
    budgets: Budgets
    """Every budget set (:attr:`Budgets.complete`)."""
    level: int = 0
    """The curriculum level (ladder index) the warm start ended at: where RL begins."""


@dataclass(frozen=True)
class Stage:
    """One level of a warm start: its demonstrations and held-out rewarded ones."""

    demos: list[Any]
    holdout: list[Any]
    level: str = ""
    """The level in words (``hops=8``; empty without a curriculum)."""

    @property
    def at(self) -> str:
        """`` at hops=8`` (empty without a curriculum), for the run's output."""
        return f" at {self.level}" if self.level else ""


def prepare(plan: PreparePlan, run_dir: str | Path, *,
            save: Callable[[Budgets], None] = lambda budgets: None,
            say: Callable[[str], None] = logger.info) -> Start:
    """Fit a new run to its env and warm-start it (module docs); its :class:`Start`.

    ``save(budgets)`` is called once the budgets are fitted, before the warm
    start (the job writes the run's config there, so ``--resume`` finds it).
    """
    from transformers import AutoConfig, AutoTokenizer

    from sao_gym.runtime.prepare.fit import fit_budgets, fit_label_smoothing

    run_dir = Path(run_dir)
    demos = Demonstrations(plan.demonstrations) if plan.demonstrations is not None else None
    say(f"demonstrations: {demos.what}" if demos is not None else plan.no_warm_start)
    corpus = (env_corpus(plan.model, plan.env, plan.seed, demos)
              if needs_corpus(plan.model, run_dir) else [])
    policy = base_policy(plan.model, run_dir, corpus)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    positions = getattr(AutoConfig.from_pretrained(policy), "max_position_embeddings", None)
    budgets = plan.budgets
    stages: list[Stage] = []
    if demos is not None:
        started = time.monotonic()
        for index, level_demos in enumerate(_levels(demos, plan.curriculum)):
            train, holdout = level_demos.collect(tokenizer, budgets={
                "max_new_tokens": budgets.max_new_tokens or COLLECT_NEW_TOKENS,
                "max_context_tokens": budgets.max_context_tokens or positions})
            stages.append(Stage(train, [d for d in holdout if d.reward > 0],
                                _level_name(plan.curriculum, index)))
            rewards = [d.reward for d in train]
            say(f"collected {len(train)} demonstrations{stages[-1].at} (+{len(holdout)} held "
                f"out), mean reward {sum(rewards) / len(rewards):.2f} "
                f"({time.monotonic() - started:.0f} s)")
    every = [d for stage in stages for d in stage.demos + stage.holdout]
    budgets, lines = fit_budgets(budgets, every, turn_limit=plan.turn_limit,
                                 model_positions=positions)
    budgets, more = fit_label_smoothing(budgets, stages[-1].demos if stages else [])
    for line in lines + more:
        say(line)
    save(budgets)
    level = reached_level(policy, plan.curriculum)  # a finished warm start keeps its level
    if demos is not None and plan.sft is not None:
        _keep_demonstrations(run_dir, stages)
        settings = dataclasses.replace(plan.sft, label_smoothing=budgets.label_smoothing)
        policy, level = warm_start(settings, policy, run_dir, stages, say=say,
                                   curriculum=plan.curriculum)
    return Start(policy, budgets, level)


def resume(plan: PreparePlan, run_dir: str | Path, *, has_checkpoint: bool,
           save: Callable[[Budgets], None] = lambda budgets: None,
           say: Callable[[str], None] = logger.info) -> Start:
    """A resumed run's :class:`Start` (its plan is the saved config's: budgets fitted).

    The finished warm start's checkpoint; an interrupted warm start is
    continued first (from its saved state, on its kept demonstrations), and
    one that never began (no checkpoint of RL either: ``has_checkpoint``) is
    prepared again. Without a warm start, the base model.
    """
    run_dir = Path(run_dir)
    warm = run_dir / "model" / WARM_START
    if (warm / "config.json").exists():
        return Start(str(warm), plan.budgets, reached_level(warm, plan.curriculum))
    kept = run_dir / "model" / WARM_STATE / DEMONSTRATIONS
    if kept.exists() and plan.sft is not None:
        stages = pickle.loads(kept.read_bytes())
        say("the warm start was interrupted: continuing it")
        policy, level = warm_start(plan.sft, base_policy(plan.model, run_dir), run_dir, stages,
                                   say=say, curriculum=plan.curriculum)
        return Start(policy, plan.budgets, level)
    if plan.demonstrations is not None and plan.sft is not None and not has_checkpoint:
        say("the run stopped before its warm start began: preparing it again")
        return prepare(plan, run_dir, save=save, say=say)
    policy = base_policy(plan.model, run_dir)
    return Start(policy, plan.budgets, reached_level(policy, plan.curriculum))


def reached_level(warm: str | Path, curriculum: Curriculum | None) -> int:
    """Where on ``curriculum``'s ladder RL begins after the warm start ``warm``.

    The index of the level it ended at (0 without a curriculum, a record, or that
    level on this ladder). Also a run whose ``model`` is another run's warm start
    (``RUN/model/warm_start``) begins RL at that warm start's level.
    """
    record = Path(warm) / WARM_RECORD
    if curriculum is None or not record.exists():
        return 0
    climbed = json.loads(record.read_text()).get("curriculum")
    if not climbed or climbed.get("knob") != curriculum.knob:
        return 0
    level = climbed["levels"][climbed["level"]]
    return curriculum.levels.index(level) if level in curriculum.levels else 0


def _levels(demos: Demonstrations, curriculum: Curriculum | None) -> list[Demonstrations]:
    """The demonstrations of each level of ``curriculum``'s ladder (just ``demos`` without)."""
    if curriculum is None:
        return [demos]
    return [Demonstrations(_at_level(demos.plan, curriculum.kwargs(i)))
            for i in range(len(curriculum.levels))]


def _at_level(plan: Any, level: dict[str, Any]) -> Any:
    """A demonstration plan whose env (and harness tasks, for a harness run) take ``level``."""
    plan = dataclasses.replace(plan, env=dataclasses.replace(
        plan.env, kwargs={**plan.env.kwargs, **level}))
    if plan.harness is not None and plan.harness.tasks.env is not None:
        tasks = plan.harness.tasks
        plan = dataclasses.replace(plan, harness=dataclasses.replace(
            plan.harness, tasks=dataclasses.replace(
                tasks, env_kwargs={**tasks.env_kwargs, **level})))
    return plan


def _level_name(curriculum: Curriculum | None, index: int) -> str:
    return "" if curriculum is None else f"{curriculum.knob}={curriculum.levels[index]!r}"


def _keep_demonstrations(run_dir: Path, stages: list[Stage]) -> None:
    """The warm start's inputs, so that an interrupted one continues on the same data."""
    state = run_dir / "model" / WARM_STATE
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / (DEMONSTRATIONS + ".tmp")
    tmp.write_bytes(pickle.dumps(stages))
    tmp.replace(state / DEMONSTRATIONS)


def warm_start(settings: SFTSettings, base: str, run_dir: str | Path, stages: list[Stage], *,
               say: Callable[[str], None] = logger.info,
               curriculum: Curriculum | None = None) -> tuple[str, int]:
    """Supervised warm start of ``base``, stage by stage; ``(new checkpoint, last stage)``.

    ``stages``: one per curriculum level (one without a curriculum), each its
    training demonstrations and held-out rewarded ones. Each stage trains on
    its own demonstrations from the last stage's weights until its held-out
    check reaches ``settings.target_success`` (and ``min_sampled``), then the
    next begins; ``settings.steps`` bounds all of them together, and the
    stage it ends in is where RL begins. Without held-out demonstrations a
    stage runs every step left. Its state is kept in ``RUN_DIR/model/``
    (:data:`WARM_STATE`) until it finishes, so an interrupted one continues
    in the stage it was in. Progress (loss, token accuracy) goes to ``say``
    every tenth of the steps.
    """
    out = Path(run_dir) / "model" / WARM_START
    state = Path(run_dir) / "model" / WARM_STATE
    if (out / "config.json").exists():
        shutil.rmtree(state, ignore_errors=True)
        return str(out), reached_level(out, curriculum)
    say(f"warm start: at most {settings.steps} supervised steps on "
        f"{sum(len(st.demos) for st in stages)} demonstrations"
        + (f", level by level ({', '.join(st.level for st in stages)})" if len(stages) > 1
           else ""))
    progress = state / PROGRESS  # the record's inputs, for a warm start resumed at its end
    done: list[dict[str, Any]] = (json.loads(progress.read_text()).get("stages", [])
                                  if progress.exists() else [])
    policy, used = base, sum(d["steps"] for d in done)
    for index, stage in enumerate(stages):
        last = index == len(stages) - 1
        target = out if last else state / f"level_{index}.model"
        if index < len(done):
            policy = str(target)
            continue
        left = settings.steps - used
        seen = _stage(dataclasses.replace(settings, steps=left), policy, target, stage,
                      state / f"level_{index}", progress, done, say)
        last_step = seen["last"].step if "last" in seen else 0
        reached = bool("last" in seen and seen["last"].reached)
        checked = seen.get("checked")
        done.append({"level": stage.level, "steps": last_step, "reached": reached,
                     "last_check": None if checked is None else {
                         "step": checked.step, "sampled": checked.holdout_sampled,
                         "greedy": checked.holdout_greedy}})
        _write_progress(progress, {"stages": done})
        used += last_step
        policy = str(target)
        if last or not reached or used >= settings.steps:
            if not last:  # RL begins at this level, from these weights
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(target, out)
            break
    _write_record(out, settings, done, stages, curriculum)
    shutil.rmtree(state, ignore_errors=True)
    return str(out), len(done) - 1


def _stage(settings: SFTSettings, base: str, out: Path, stage: Stage, state: Path,
           progress: Path, done: list[dict[str, Any]],
           say: Callable[[str], None]) -> dict[str, Any]:
    """One level's :func:`~sao_gym.learner.sft.sft` to ``out``; its last and last checked steps."""
    from sao_gym.learner.sft import SFTStep, sft

    if not stage.holdout:
        settings = dataclasses.replace(settings, target_success=None)
    steps, target = settings.steps, settings.target_success
    every = max(1, steps // 10)
    at = stage.at
    kept = json.loads(progress.read_text()).get("current", {}) if progress.exists() else {}
    seen: dict[str, Any] = {k: SFTStep(**v) for k, v in kept.items()}

    def report(s: SFTStep) -> None:
        seen["last"] = s
        if s.holdout_success is not None:
            seen["checked"] = s
            _write_progress(progress, {"stages": done, "current": {
                k: dataclasses.asdict(v) for k, v in seen.items()}})
        if s.step % every == 0 or s.step == steps or s.reached:
            held = ("" if s.holdout_success is None
                    else f", held-out success {s.holdout_sampled:.3f} sampled / "
                         f"{s.holdout_greedy:.3f} greedy")
            say(f"warm start{at} step {s.step}/{steps}: loss {s.loss:.3f}, "
                f"token accuracy {s.token_accuracy:.3f}{held} ({s.elapsed_s:.0f} s)")
        if s.reached:
            floor = ("" if settings.min_sampled is None
                     else f" and sampled success the floor {settings.min_sampled}")
            say(f"warm start{at} stopped: held-out {settings.target_metric} success reached "
                f"the target {target}{floor}")
        elif s.step == steps and s.holdout_success is not None:
            say(f"warm start{at}: the held-out target was not reached in {steps} steps; "
                "RL starts from this checkpoint (raise warm_start.steps, or lower "
                "warm_start.target_success)")

    sft(base, stage.demos, settings, out_dir=out, holdout=stage.holdout or None,
        callback=report, state_dir=state)
    return seen


def _write_progress(progress: Path, data: dict[str, Any]) -> None:
    progress.parent.mkdir(parents=True, exist_ok=True)
    tmp = progress.with_name(progress.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(progress)


def _write_record(out: Path, settings: SFTSettings, done: list[dict[str, Any]],
                  stages: list[Stage], curriculum: Curriculum | None) -> None:
    """:data:`WARM_RECORD`: where the warm start stopped and why, what made it.

    Nothing in it depends on the clock, so two warm starts of the same recipe,
    env and seed on the same machine have the same record (and weights).
    """
    from importlib.metadata import version

    final = done[-1] if done else None
    record = {
        "stopped_at_step": None if final is None else sum(d["steps"] for d in done),
        "max_steps": settings.steps,
        "reached_target": bool(final is not None and final["reached"]),
        "target": {"metric": settings.target_metric, "success": settings.target_success,
                   "min_sampled": settings.min_sampled},
        "last_check": None if final is None else final["last_check"],
        "demonstrations": sum(len(st.demos) for st in stages),
        "holdout_demonstrations": sum(len(st.holdout) for st in stages),
        "settings": dataclasses.asdict(settings),
        "versions": {name: version(name) for name in ("sao-gym", "torch", "transformers",
                                                      "tokenizers")},
    }
    if curriculum is not None:
        record["curriculum"] = {"knob": curriculum.knob, "levels": list(curriculum.levels),
                                "level": len(done) - 1, "stages": done}
    tmp = out / (WARM_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out / WARM_RECORD)


__all__ = ["DEMONSTRATIONS", "WARM_RECORD", "WARM_STATE", "WARM_START", "Stage", "Start",
           "prepare", "reached_level", "resume", "warm_start"]
