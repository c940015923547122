"""The builder: the one reader of a :class:`~sao_gym.runtime.config.schema.TrainConfig`.

Everything else receives records. The builder turns a config into

- :func:`run_parts`: the run's :class:`~sao_gym.runtime.parts.RunParts` (small
  picklable factories: learner, rollouts = env + backend + agent, source,
  sink, recorder), which a runtime places (:mod:`sao_gym.runtime.place`);
- :func:`prepare_plan`: the :class:`~sao_gym.runtime.plans.PreparePlan` (model,
  demonstrations, warm-start settings, budgets to fit);
- :func:`eval_plan`: an :class:`~sao_gym.runtime.plans.EvalPlan`;
- :func:`train_plan`: the whole job's :class:`~sao_gym.runtime.plans.TrainPlan`
  (the three above, where the parts run, restarts, the config's record);

and :func:`check_setup` finds the mistakes that would otherwise surface after
minutes of set-up (an unknown env, a warm start without an oracle, a model
that is not there). :func:`build_trainer` is the short way from a config to a
trainer (scripts, benchmarks, tests). A test walks the package's syntax trees:
no other module (the schema and the loader excepted) reads a config's fields.
This module imports nothing of the runtimes that place the parts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

from sao_gym.curriculum import Curriculum
from sao_gym.learner.config import SFTSettings
from sao_gym.runtime.config.schema import RUNTIMES, ConfigError, TrainConfig
from sao_gym.runtime.parts import (
    AgentFactory,
    EnvFactory,
    HarnessFactory,
    LearnerFactory,
    RecorderFactory,
    RolloutFactory,
    RunParts,
    SinkFactory,
    SourceFactory,
)
from sao_gym.runtime.plans import (
    EVAL_SEED,
    Budgets,
    DemonstrationPlan,
    EvalPlan,
    ModelPlan,
    PreparePlan,
    TrainPlan,
)

logger = logging.getLogger(__name__)

WARM_START_CHECKS = 16
"""Tasks the warm-start oracle is tried on before a run (a setup error if one fails)."""


class SetupError(ConfigError):
    """The config is valid but cannot run here (unknown env, no oracle, missing model)."""


# ---------------------------------------------------------------------------
# the parts
# ---------------------------------------------------------------------------


def env_factory(config: TrainConfig) -> EnvFactory:
    """Builds one environment of the run (its turn limit and constructor options applied)."""
    return EnvFactory(require_env(config), config.rollout.max_episode_steps,
                      dict(config.env_kwargs))


def oracle_for(env_id: str, **kwargs: Any) -> Any:
    """The demonstration policy registered with ``env_id``, its options bound; None if none."""
    from sao_gym.registration import env_oracle

    oracle = env_oracle(env_id)
    if oracle is None:
        if kwargs:
            raise SetupError(f"warm_start.oracle sets options {sorted(kwargs)}, but {env_id} "
                             "registers no oracle (sao_gym.register(..., oracle=...))")
        return None
    return functools.partial(oracle, **kwargs) if kwargs else oracle


def require_env(config: TrainConfig) -> str:
    """The run's env id; a :class:`SetupError` when the config names none."""
    if config.env is None:
        raise SetupError("no environment: set env=ID in the config or --set env=ID "
                         "(module:ID for an env your own module registers)")
    return config.env


def curriculum(config: TrainConfig) -> Curriculum | None:
    """The run's :class:`~sao_gym.curriculum.Curriculum` at its first level; None without one.

    The knob and levels are the ``curriculum`` section's, else the env's
    declared ones (``register(..., difficulty=...)``); the ladder ends at the
    run's own value of the knob. None when the section is null, when the env
    declares no knob, or when the ladder has one level.
    """
    import gymnasium

    from sao_gym.curriculum import Curriculum, Difficulty, knob_value, ladder
    from sao_gym.registration import env_difficulty, resolve_id

    c = config.curriculum
    if c is None:
        return None
    if config.agent.harness is not None and config.agent.tasks is not None:
        raise SetupError("curriculum: a harness's tasks from a file (agent.tasks) have no "
                         "env options to raise; a curriculum needs the env's own tasks")
    env_id = resolve_id(require_env(config))
    declared = env_difficulty(env_id)
    try:
        if c.knob is not None:
            levels = c.levels if c.levels is not None else (
                declared.levels if declared is not None and declared.knob == c.knob else [])
            declared = Difficulty(c.knob, tuple(levels))
        if declared is None:
            return None
        spec = gymnasium.spec(env_id)
        entry = spec.entry_point
        if isinstance(entry, str):
            from gymnasium.envs.registration import load_env_creator

            entry = load_env_creator(entry)
        target = knob_value(entry, {**spec.kwargs, **config.env_kwargs}, declared.knob)
        climb = ladder(declared, target)
    except ValueError as e:
        raise SetupError(f"curriculum: {e}") from None
    if len(climb) < 2:
        return None
    return Curriculum(declared.knob, climb, promote_at=c.promote_at, window=c.window,
                      demote_below=c.demote_below)


def learner_factory(config: TrainConfig) -> LearnerFactory:
    """The learner: algorithm, learner config, run length, sampler temperature, group size.

    The group size is ``rollout.group_size``, the one place it is set.
    """
    return LearnerFactory(config.algorithm, config.learner, config.total_steps,
                          config.rollout.temperature, config.rollout.group_size)


def backend_factory(config: TrainConfig, *, batch_invariant: bool = False) -> Any:
    """The ``inference`` section: its own keys and the builder of the backend.

    A null ``batch_invariant`` of the hf backend is ``batch_invariant`` (training a
    sync run passes True: :func:`run_parts`); launched servers load adapters of the
    learner's LoRA rank. (A null context limit follows the agent's context budget:
    :meth:`~sao_gym.runtime.parts.RolloutFactory.with_budgets`.)
    """
    inf = config.inference
    if getattr(inf, "max_lora_rank", 0) is None and config.learner.lora is not None:
        inf = dataclasses.replace(inf, max_lora_rank=config.learner.lora.rank)
    if getattr(inf, "batch_invariant", False) is None:
        inf = dataclasses.replace(inf, batch_invariant=batch_invariant)
    return inf


def budgets(config: TrainConfig, *, warm_start: bool) -> Budgets:
    """The config's token budgets and label smoothing (None: to be fitted).

    Without a warm start (``warm_start``: the run has demonstrations to train on)
    the label smoothing is 0.0: there is nothing to fit it to.
    """
    smoothing = config.warm_start.label_smoothing if warm_start else 0.0
    return Budgets(config.rollout.max_new_tokens, config.rollout.max_context_tokens, smoothing)


def rollout_factory(config: TrainConfig, *, temperature: float | None = None,
                    training: bool = False, batch_invariant: bool | None = None
                    ) -> RolloutFactory:
    """Env + backend + agent of the run (``temperature`` defaults to ``rollout.temperature``).

    The ``training`` rollouts of a sync run are batch-invariant unless the config
    (or ``batch_invariant``) says otherwise: with each episode's own sampling seed
    (:func:`~sao_gym.runtime.loop.source.episode_seed`) such a run is reproducible.
    Null budgets stay null until fitted.
    """
    r = config.rollout
    if batch_invariant is None:
        batch_invariant = training and config.max_staleness == 0
    agent = AgentFactory(None, None,
                         temperature=r.temperature if temperature is None else temperature,
                         top_p=r.top_p, tool_schemas=r.tool_schemas)
    factory = RolloutFactory(env_factory(config),
                             backend_factory(config, batch_invariant=batch_invariant), agent,
                             harness_factory(config))
    return factory.with_budgets(r.max_new_tokens, r.max_context_tokens)


def harness_factory(config: TrainConfig) -> HarnessFactory | None:
    """The ``agent`` section's harness (None: the package's own agent).

    Tasks come from ``agent.tasks`` or, without it, the seeds of ``env``.
    """
    from sao_gym.gateway.harness import Harness
    from sao_gym.gateway.tasks import TaskSource

    a = config.agent
    if a.harness is None:
        return None
    try:
        harness = Harness(a.program, a.argv(), a.timeout_s)
        tasks = (TaskSource(path=a.tasks) if a.tasks is not None
                 else TaskSource(env=require_env(config), env_kwargs=dict(config.env_kwargs)))
    except ValueError as e:
        raise SetupError(str(e)) from None
    return HarnessFactory(harness, tasks, a.reward, a.workers)


def rollout_bytes(config: TrainConfig) -> tuple[int, int | None]:
    """``(segment_bytes, max_bytes)`` of the run's kept rollouts (``logging.rollouts_*_mb``)."""
    log = config.logging
    mb = 1 << 20
    return (int(log.rollouts_segment_mb * mb),
            None if log.rollouts_max_mb is None else int(log.rollouts_max_mb * mb))


def recorder_factory(config: TrainConfig) -> RecorderFactory:
    """What the run keeps of its training rollouts (``logging.rollouts_*``)."""
    segment, most = rollout_bytes(config)
    return RecorderFactory(config.logging.rollouts_per_step, segment, most, config.seed)


def run_parts(config: TrainConfig, *, batch_invariant: bool | None = None) -> RunParts:
    """The run's factories and scalars (:mod:`sao_gym.runtime.parts`): all a runtime needs.

    ``batch_invariant``: of the training rollouts' sampling when the config leaves
    it null (None: on in sync mode, :func:`rollout_factory`).
    """
    r = config.rollout
    return RunParts(
        learner=learner_factory(config),
        rollouts=rollout_factory(config, training=True, batch_invariant=batch_invariant),
        source=SourceFactory(r.batch_size, r.group_size, config.max_staleness,
                             r.max_infra_retries),
        sink=SinkFactory(tuple(config.logging.names), config.to_dict()),
        total_steps=config.total_steps, seed=config.seed, concurrency=r.concurrency,
        checkpoint_every=config.checkpoint.every, checkpoint_keep=config.checkpoint.keep,
        ray=config.ray if config.runtime == "ray" else None,
        episodes_per_worker=config.episodes_per_worker,
        recorder=recorder_factory(config), curriculum=curriculum(config))


# ---------------------------------------------------------------------------
# the plans
# ---------------------------------------------------------------------------


def turn_limit(config: TrainConfig) -> int | None:
    """The run's turn limit: ``rollout.max_episode_steps`` or the env's registered one."""
    import gymnasium

    from sao_gym.registration import resolve_id

    if config.rollout.max_episode_steps is not None:
        return config.rollout.max_episode_steps
    return gymnasium.spec(resolve_id(require_env(config))).max_episode_steps


def demonstration_plan(config: TrainConfig) -> DemonstrationPlan | None:
    """Where the warm start's demonstrations come from; None without a warm start or a source."""
    ws = config.warm_start
    if ws is None or not ws.steps:
        return None
    common = dict(env=env_factory(config), episodes=ws.episodes,
                  holdout_episodes=ws.holdout_episodes if ws.target_success is not None else 0,
                  seed=config.seed, template_format=ws.demonstration_format == "template",
                  tool_schemas=config.rollout.tool_schemas)
    harness = harness_factory(config)
    if harness is not None:
        return harness_demonstration_plan(config, harness, common)
    if ws.demonstrations is not None:
        return DemonstrationPlan(conversations=ws.demonstrations, **common)
    oracle = oracle_for(require_env(config), **ws.oracle)
    return DemonstrationPlan(oracle=oracle, **common) if oracle is not None else None


def harness_demonstration_plan(config: TrainConfig, harness: HarnessFactory,
                               common: dict[str, Any]) -> DemonstrationPlan | None:
    """A harness run's demonstrations: an oracle answering the harness through the gateway.

    The oracle is ``agent.oracle`` or, for tasks from the env's seeds, the env's
    registered one (``warm_start.oracle``'s options bound either way); None
    without one.
    """
    from sao_gym.utils.imports import import_reference

    ws = config.warm_start
    assert ws is not None
    if ws.demonstrations is not None:
        raise SetupError("a harness run's demonstrations are an oracle's episodes through the "
                         "gateway (agent.oracle): warm_start.demonstrations replays env "
                         "episodes, in another prompt format")
    name = config.agent.oracle
    if name is not None:
        try:
            oracle = import_reference(name, what="agent.oracle")
        except (ImportError, ValueError) as e:
            raise SetupError(str(e)) from None
        oracle = functools.partial(oracle, **ws.oracle) if ws.oracle else oracle
    elif harness.tasks.env is not None:
        oracle = oracle_for(harness.tasks.env, **ws.oracle)
    else:
        oracle = None
    if oracle is None:
        return None
    return DemonstrationPlan(oracle=oracle, harness=harness, oracle_name=name, **common)


def sft_settings(config: TrainConfig) -> SFTSettings | None:
    """The warm start's :class:`~sao_gym.learner.config.SFTSettings` (None: no warm start).

    A null ``label_smoothing`` is fitted later (0.0 here until then).
    """
    ws = config.warm_start
    if ws is None or not ws.steps:
        return None
    return SFTSettings(steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size, seed=config.seed,
                       warmup_steps=ws.steps // 20, label_smoothing=ws.label_smoothing or 0.0,
                       target_success=ws.target_success, target_metric=ws.target_metric,
                       min_sampled=ws.min_sampled_success)


def prepare_plan(config: TrainConfig) -> PreparePlan:
    """How the run gets its starting checkpoint (:mod:`sao_gym.runtime.prepare.start`)."""
    demos = demonstration_plan(config)
    ws = config.warm_start
    why = ""
    if demos is None and ws is not None and ws.steps and config.agent.harness is not None:
        why = ("no warm start: the harness's tasks come from a file and agent.oracle names no "
               "oracle to answer it, so RL starts from the raw model")
    elif demos is None:
        why = (f"no warm start: {config.env} registers no oracle and warm_start.demonstrations "
               "names no file, so RL starts from the raw model"
               if ws is not None and ws.steps else "no warm start (warm_start: null)")
    model = ModelPlan(config.model, config.seed, dict(config.model_options),
                      config.chat_template)
    return PreparePlan(model=model, env=env_factory(config), seed=config.seed,
                       turn_limit=turn_limit(config),
                       budgets=budgets(config, warm_start=demos is not None),
                       demonstrations=demos, sft=sft_settings(config) if demos else None,
                       no_warm_start=why, curriculum=curriculum(config))


def eval_plan(config: TrainConfig, *, episodes: int | None = None, seed: int = EVAL_SEED
              ) -> EvalPlan:
    """An evaluation as the config says (``episodes``: default ``eval.episodes``).

    Its temperature is ``eval.temperature``, else the rollouts'.
    """
    temperature = config.eval.temperature
    temperature = config.rollout.temperature if temperature is None else temperature
    return EvalPlan(rollouts=rollout_factory(config, temperature=temperature),
                    episodes=config.eval.episodes if episodes is None else episodes,
                    temperature=temperature, seed=seed, concurrency=config.rollout.concurrency,
                    turn_limit=turn_limit(config), keep=config.logging.eval_rollouts,
                    rollout_bytes=rollout_bytes(config), model_name=config.model)


def restarts(config: TrainConfig) -> int:
    """Times a run rebuilds itself when a learner rank dies.

    ``ray.max_learner_restarts`` on Ray; a local run stops and ``--resume`` continues it.
    """
    return config.ray.max_learner_restarts if config.runtime == "ray" else 0


def title(config: TrainConfig) -> str:
    """The run in one line: algorithm, mode, env, model, steps."""
    return (f"{config.algorithm} ({config.mode}) on {config.env}, model {config.model}, "
            f"{config.total_steps} steps")


def train_plan(config: TrainConfig) -> TrainPlan:
    """The whole ``sao-gym train`` job of ``config`` (:class:`~sao_gym.runtime.plans.TrainPlan`)."""
    require_env(config)
    return TrainPlan(prepare=prepare_plan(config), parts=run_parts(config),
                     eval=eval_plan(config), place=RUNTIMES[config.runtime],
                     restarts=restarts(config), record=config.to_dict(), title=title(config))


def build_trainer(config: TrainConfig, run_dir: str | Path, *, policy_path: str,
                  resume: bool = False, sinks: Any = (),
                  batch_invariant: bool | None = None) -> Any:
    """The :class:`~sao_gym.runtime.loop.trainer.Trainer` of ``config`` in ``run_dir``.

    The config becomes the run's parts once (:func:`run_parts`; ``batch_invariant``
    as there); ``runtime`` picks where they run
    (:data:`~sao_gym.runtime.config.schema.RUNTIMES`). ``policy_path`` is the
    starting checkpoint; with ``resume`` the latest checkpoint wins. A fresh run
    saves its config.
    """
    from sao_gym.runtime.config.loader import save_config
    from sao_gym.runtime.job import place

    require_env(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        save_config(config, run_dir / "config.yaml")
    return place(run_parts(config, batch_invariant=batch_invariant), RUNTIMES[config.runtime],
                 run_dir, policy_path=policy_path, resume=resume, sinks=sinks)


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def check_setup(config: TrainConfig) -> None:
    """Raise :class:`SetupError` (one line) for what would fail later in the job."""
    from sao_gym.models import check_model

    env_id = require_env(config)
    try:
        env = env_factory(config)()
    except Exception as e:  # noqa: BLE001 - any failure to build is a setup error
        hint = ""
        if isinstance(e, TypeError) and config.env_kwargs:
            hint = (f" (env_kwargs {config.env_kwargs} come from the config or recipe; "
                    "--set 'env_kwargs={}' clears them)")
        raise SetupError(f"cannot make env {env_id!r}: {type(e).__name__}: {e}{hint}"
                         ) from None
    ws = config.warm_start
    try:
        if ws is not None and ws.steps and ws.demonstrations is not None:
            from sao_gym.runtime.prepare.conversations import load_conversations

            try:
                load_conversations(ws.demonstrations)
            except ValueError as e:
                raise SetupError(f"warm_start.demonstrations: {e}") from None
        elif ws is not None and ws.steps:
            oracle = oracle_for(env_id, **ws.oracle)
            try:  # it must play this env's tasks (it may know only some kinds); a sample of them
                for i in range(WARM_START_CHECKS if oracle is not None else 0):
                    obs, _ = env.reset(seed=config.seed + i)
                    oracle(obs, env.unwrapped.task)
            except Exception as e:  # noqa: BLE001 - any failure is a setup error
                raise SetupError(f"the warm-start oracle of {env_id} cannot play its tasks "
                                 f"(env_kwargs {config.env_kwargs}): {e}") from None
    finally:
        env.close()
    try:
        check_model(config.model)
    except FileNotFoundError as e:
        raise SetupError(str(e)) from None
    check_harness(config)


def check_harness(config: TrainConfig) -> None:
    """A :class:`SetupError` for a harness (``agent``) that cannot run.

    Its program, verifier, oracle or task file.
    """
    from sao_gym.gateway.harness import verifier

    made = harness_factory(config)
    if made is None:
        return
    demonstration_plan(config)  # an oracle that cannot be imported fails here
    try:
        if made.harness.program is not None:
            made.harness.function()
        if made.reward is not None:
            verifier(made.reward)
        made.tasks.load()
    except (ImportError, TypeError, ValueError, OSError) as e:
        raise SetupError(str(e)) from None
