"""The ``sao-gym train`` and ``sao-gym eval`` jobs, over plans.

The CLI reads the config and hands it to the builder
(:mod:`sao_gym.runtime.config.build`); what reaches this module are records
(:mod:`sao_gym.runtime.plans`). :func:`train` runs a
:class:`~sao_gym.runtime.plans.TrainPlan`:

1. the starting checkpoint: :func:`~sao_gym.runtime.prepare.start.prepare`
   (demonstrations, the model, budgets fitted to the env, the warm start), or
   on ``--resume`` :func:`~sao_gym.runtime.prepare.start.resume`; the plan
   takes the fitted budgets (:meth:`~sao_gym.runtime.plans.TrainPlan.fitted`)
   and the resolved config is saved;
2. an evaluation of the starting model (:func:`evaluate`);
3. the :class:`~sao_gym.runtime.loop.trainer.Trainer`, its parts placed where
   the plan says (:func:`place`); a learner rank that dies
   (:class:`~sao_gym.learner.ranks.RankDied`, in a local rank group or on
   Ray) rebuilds the run from its last checkpoint, up to ``plan.restarts`` times;
4. an evaluation of the trained policy, and plots.

Every artefact lands in the run directory::

    RUN_DIR/config.yaml          the resolved configuration (fitted budgets included)
    RUN_DIR/model/               the starting checkpoint (after any warm start; an
                                 interrupted warm start's state, which --resume continues)
    RUN_DIR/metrics.jsonl        one line per learner step
    RUN_DIR/checkpoints/step_N/  atomic checkpoints (policy/ is servable)
    RUN_DIR/eval_before.json, eval_after.json
    RUN_DIR/rollouts/            kept rollouts: a sample of each step's, all evaluations'
    RUN_DIR/plots/*.png

:func:`evaluate` plays a policy as an :class:`~sao_gym.runtime.plans.EvalPlan`
says (the run's env and options, turn limit, token budgets, temperature and
inference backend), each episode seeded, so ``sao-gym eval --run RUN``
repeats the run's own evaluation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sao_gym.evaluation import progress_lines
from sao_gym.runtime.plans import EvalPlan, TrainPlan

logger = logging.getLogger(__name__)

PLOT_SMOOTHING = 0.9
"""EMA weight of the job's curves (the raw values are drawn faint beneath)."""


def evaluate(plan: EvalPlan, policy_path: str, *, run_dir: str | Path | None = None,
             on_done: Callable[[Any], None] | None = None, keep: str | None = None,
             step: int | None = None) -> dict[str, Any]:
    """Success rate, mean return, mean turns and infra failures of ``policy_path``.

    Plays ``plan.episodes`` episodes with env seeds from ``plan.seed``, as the
    plan says (its rollouts: env and options, turn limit, token budgets,
    inference backend, temperature). Each episode's sampling is seeded by its
    env seed, so the numbers repeat for the same seeds. An episode whose
    environment or agent fails counts as an infra failure (reported, never
    averaged in); when all of them do,
    :class:`~sao_gym.runtime.loop.source.RolloutsFailing` is raised (there is
    nothing to report). ``on_done(rollout)`` is called as each episode ends
    (progress). ``keep``: with ``run_dir``, every episode is kept in that split
    of the run's rollouts (replacing an earlier one of that name; ``step``: the
    learner step of the policy, recorded with them).
    """
    from sao_gym.evaluation import EpisodeSummary, play_seeds

    async def play() -> list:
        rollouts = plan.rollouts(policy_path, seed=plan.seed, run_dir=run_dir)
        try:  # each episode samples with its own seed: the same numbers whatever runs beside
            return await play_seeds(lambda s: rollouts.play(s, s), plan.episodes,
                                    concurrency=plan.concurrency, seed=plan.seed,
                                    on_done=on_done)
        finally:
            await rollouts.aclose()

    start = time.monotonic()
    rollouts = asyncio.run(play())
    if keep is not None and run_dir is not None:
        keep_episodes(plan, run_dir, keep, rollouts, policy_path=policy_path, step=step)
    summary = EpisodeSummary.of(rollouts).__dict__
    if rollouts and summary["infra_failures"] == len(rollouts):
        from sao_gym.runtime.loop.source import RolloutsFailing

        raise RolloutsFailing(
            f"evaluating {policy_path}: all {len(rollouts)} episodes failed "
            f"({summary['failure_reasons']}); the log above says why (e.g. no inference "
            "server left)")
    return {**summary, "model": str(policy_path), **plan.report(),
            "elapsed_s": round(time.monotonic() - start, 2)}


def keep_episodes(plan: EvalPlan, run_dir: str | Path, split: str, rollouts: list[Any], *,
                  policy_path: str, step: int | None = None) -> None:
    """Keep ``rollouts`` as split ``split`` of the run's rollouts (an earlier one is replaced)."""
    from transformers import AutoTokenizer

    from sao_gym.rollout_store import ROLLOUTS_DIR, check_split
    from sao_gym.runtime.loop.recorder import record_episodes

    shutil.rmtree(Path(run_dir) / ROLLOUTS_DIR / check_split(split), ignore_errors=True)
    segment, most = plan.rollout_bytes
    record_episodes(run_dir, split, rollouts, step=step,
                    tokenizer=AutoTokenizer.from_pretrained(policy_path),
                    segment_bytes=segment, max_bytes=most)


def train(plan: TrainPlan, run_dir: str | Path, *, resume: bool = False,
          display: Any = None, say: Callable[[str], None] = logger.info) -> dict[str, Any]:
    """The whole ``sao-gym train`` job (module docs); returns where everything is.

    ``display`` (a :class:`~sao_gym.progress.ProgressDisplay`) gets every
    step's metrics; its clock starts when RL starts, so its ETA counts
    training time only. On ``resume`` the plan is the run's saved config's
    (budgets already fitted); a finished warm start is not run again, an
    interrupted one continues where it was saved.
    """
    from sao_gym.runtime.config.loader import write_record
    from sao_gym.runtime.loop.checkpoint import CheckpointManager
    from sao_gym.runtime.prepare import start

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    def save(budgets: Any) -> None:
        write_record(plan.fitted(budgets).record, run_dir / "config.yaml")

    if resume:
        begin = start.resume(plan.prepare, run_dir, save=save, say=say,
                             has_checkpoint=bool(CheckpointManager(run_dir).complete()))
    else:
        begin = start.prepare(plan.prepare, run_dir, save=save, say=say)
    plan, policy = plan.fitted(begin.budgets), begin.policy
    plan = dataclasses.replace(plan, parts=plan.parts.starting_at(begin.level))
    if plan.parts.curriculum is not None:
        c = plan.parts.curriculum
        say(f"curriculum: {c.knob} {' -> '.join(map(str, c.levels))}; RL begins at "
            f"{c.knob}={c.level!r} and moves up once {c.promote_at:.0%} of the last {c.window} "
            f"episodes at a level succeed, back down under {c.demote_below:.0%} (evaluation "
            f"plays {c.knob}={c.levels[-1]!r})")
    result: dict[str, Any] = {"run_dir": str(run_dir), "start_model": policy}
    episodes = plan.eval.episodes
    if episodes and not (run_dir / "eval_before.json").exists():
        say(f"evaluating the starting model on {episodes} episodes")
        before = evaluate(plan.eval, policy, run_dir=run_dir, step=0,
                          on_done=progress_lines(episodes, say),
                          keep="eval_before" if plan.eval.keep else None)
        (run_dir / "eval_before.json").write_text(json.dumps(before, indent=2))
    if resume:
        say(_resuming(run_dir))
    say(f"training: {plan.title}")
    trainer, last = _run_trainer(plan, run_dir, policy, resume=resume, display=display, say=say)
    result["checkpoint"] = str(last) if last else None
    result["nonfinite_steps"] = trainer.nonfinite_steps
    result.update(steps_done=trainer.learner.steps_done, total_steps=trainer.total_steps,
                  interrupted=trainer.interrupted)
    if trainer.interrupted:
        say(f"interrupted at step {trainer.learner.steps_done} of {trainer.total_steps}: "
            "the trained model is not evaluated")
    elif episodes and last is not None:
        say(f"evaluating the trained model on {episodes} episodes")
        after = evaluate(plan.eval, str(last / "policy"), run_dir=run_dir,
                         step=trainer.learner.steps_done,
                         on_done=progress_lines(episodes, say),
                         keep="eval_after" if plan.eval.keep else None)
        (run_dir / "eval_after.json").write_text(json.dumps(after, indent=2))
    for name in ("eval_before", "eval_after"):
        path = run_dir / f"{name}.json"
        if path.exists():
            result[name] = json.loads(path.read_text())
    result["plots"] = [str(p) for p in _plots(run_dir)]
    return result


def _run_trainer(plan: TrainPlan, run_dir: Path, policy: str, *, resume: bool,
                 display: Any, say: Callable[[str], None]) -> tuple[Any, Path | None]:
    """Place the run's parts and run the trainer; ``(trainer, last checkpoint)``.

    A learner rank that dies (:class:`~sao_gym.learner.ranks.RankDied`, whichever
    runtime placed it) makes the run rebuild itself from its last checkpoint
    (as ``--resume`` would), up to ``plan.restarts`` times.
    """
    from sao_gym.learner.ranks import RankDied

    restarts = plan.restarts
    while True:
        trainer = place(plan.parts, plan.place, run_dir, policy_path=policy, resume=resume,
                        sinks=[display] if display is not None else [])
        if display is not None:
            display.begin(trainer.learner.steps_done)
        try:
            return trainer, trainer.run()
        except RankDied as e:
            if restarts == 0:
                raise
            restarts -= 1
            resume = True
            say(f"{str(e).split(';')[0]}: restarting from the last checkpoint "
                f"({restarts} restart(s) left). {_resuming(run_dir)}")


def place(parts: Any, where: str, run_dir: str | Path, *, policy_path: str,
          resume: bool = False, sinks: Sequence[Any] = ()) -> Any:
    """The :class:`~sao_gym.runtime.loop.trainer.Trainer` of ``parts`` in ``run_dir``.

    ``where`` is a runtime of :data:`~sao_gym.runtime.config.schema.RUNTIMES`
    (``module:function``), imported now. ``policy_path`` is the starting
    checkpoint; with ``resume`` the latest checkpoint wins.
    """
    module, _, name = where.partition(":")
    placed = getattr(importlib.import_module(module), name)
    return placed(parts, run_dir, policy_path=policy_path, resume=resume, sinks=sinks)


def _resuming(run_dir: Path) -> str:
    """Where ``--resume`` takes a run up: its latest checkpoint's step."""
    from sao_gym.runtime.loop.checkpoint import CheckpointManager

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


__all__ = ["PLOT_SMOOTHING", "evaluate", "keep_episodes", "place", "train"]
