r"""Demonstrations in the agent's own token layout, for the warm start.

RL from a random model never sees a reward, so a run first teaches the model
the task's protocol with a short supervised phase on demonstrations:

- :func:`collect_demonstrations` plays episodes with :class:`~sao_gym.agents.LLMAgent`
  exactly as RL will (same chat template, same observation deltas, same
  token budget), but behind an inference backend that emits an *oracle's*
  text instead of sampling. The resulting :class:`~sao_gym.types.Rollout`\\ s
  therefore have the very layout the policy later produces itself: prompt and
  observation tokens with ``loss_mask`` 0, each assistant turn (ending with
  its end-of-turn token) with ``loss_mask`` 1.
- :class:`Demonstrations` collects a run's, as its
  :class:`~sao_gym.runtime.plans.DemonstrationPlan` says (an oracle's episodes,
  or a file's conversations), training and held-out;
- :func:`~sao_gym.learner.sft.sft` then fine-tunes on them
  (:mod:`sao_gym.runtime.prepare.start`).

An oracle is a function ``oracle(messages, task) -> str`` giving the text of
the next assistant turn from the conversation so far and the env's task
(``env.unwrapped.task``, which holds the reference answer); an environment
registers its own (``sao_gym.register(..., oracle=...)``). Without one,
demonstrations come from a JSONL file of conversations
(:mod:`sao_gym.runtime.prepare.conversations`), replayed by
:func:`acollect_demonstrations` through the same agent, so they get the same
token layout.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from sao_gym.inference.oracle import Oracle, OracleTurns
from sao_gym.runtime.plans import DEMO_SEED_OFFSET, HOLDOUT_SEED_OFFSET, DemonstrationPlan
from sao_gym.runtime.prepare.conversations import (
    load_conversations,
    replay_env_factory,
    replay_oracle,
)
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)



# ---------------------------------------------------------------------------
# demonstrations
# ---------------------------------------------------------------------------


async def acollect_demonstrations(
    env_id: str | Callable[[], Any],
    tokenizer: Any,
    oracle: Oracle,
    *,
    episodes: int,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    template_format: bool = False,
    **agent_kwargs: Any,
) -> list[Rollout]:
    """Async version of :func:`collect_demonstrations` (use it inside an event loop)."""
    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.inference.scripted import ScriptedBackend
    from sao_gym.rollout import play_episode

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    build = env_id if callable(env_id) else functools.partial(sao_gym.make, env_id,
                                                              **dict(env_kwargs or {}))

    def factories(turns: OracleTurns) -> tuple[Callable[[], Any], Callable[[], Any]]:
        def make_env() -> Any:
            env = build()
            # The task is chosen at reset, before the first act(): read it lazily.
            turns.task = _LazyTask(env)
            return env

        def make_agent() -> Any:
            turns.agent = LLMAgent(ScriptedBackend(turns), tokenizer, **agent_kwargs)
            return turns.agent

        return make_env, make_agent

    demos: list[Rollout] = []
    for i in range(episodes):
        turns = OracleTurns(tokenizer, oracle, template_format)
        rollout = await play_episode(*factories(turns), seed=seed + i)
        if turns.error is not None:
            raise RuntimeError(
                f"demonstration {i} (seed {seed + i}) failed: {turns.error}"
            ) from turns.error
        if rollout.infra_failure:
            raise RuntimeError(
                f"demonstration {i} (seed {seed + i}) ended as an infra failure "
                f"({rollout.stop_reason.value}); see the log above"
            )
        demos.append(rollout)
    rewards = [r.reward for r in demos]
    logger.info(
        "collected %d demonstrations of %s: mean reward %.3f, mean length %.1f tokens "
        "(%.1f action tokens)",
        len(demos), demos[0].env_id, sum(rewards) / len(demos),
        sum(len(r.token_ids) for r in demos) / len(demos),
        sum(r.num_action_tokens for r in demos) / len(demos),
    )
    return demos


class _LazyTask(Mapping[str, Any]):
    """``env.unwrapped.task`` read at access time (it changes at every reset)."""

    def __init__(self, env: Any):
        self._env = env

    def _task(self) -> Mapping[str, Any]:
        task = getattr(self._env.unwrapped, "task", None)
        if task is None:
            raise RuntimeError("the environment exposes no task (env.unwrapped.task is None)")
        return task

    def __getitem__(self, key: str) -> Any:
        return self._task()[key]

    def __iter__(self):
        return iter(self._task())

    def __len__(self) -> int:
        return len(self._task())


def collect_demonstrations(
    env_id: str | Callable[[], Any],
    tokenizer: Any,
    oracle: Oracle,
    *,
    episodes: int,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    template_format: bool = False,
    **agent_kwargs: Any,
) -> list[Rollout]:
    """Play ``episodes`` oracle episodes and return them as token-exact rollouts.

    ``env_id`` is an env id (made with ``env_kwargs``) or a factory of
    environments. Episode ``i`` is reset with seed ``seed + i``. Each turn, the oracle's
    text for the conversation so far is tokenized (``tokenizer``, no special
    tokens added) and closed with the agent's end-of-turn token; an
    :class:`~sao_gym.agents.LLMAgent` built with ``agent_kwargs``
    (``max_new_tokens``, ``max_context_tokens``, ...: pass the values RL will
    use) records it like a sampled turn and parses its tool calls. So the
    rollouts have exactly the token layout RL produces, with logprob 0.0 on
    every action token. With ``template_format`` the oracle's tool calls are
    first rewritten as the chat template writes them
    (:meth:`~sao_gym.agents.LLMAgent.as_template_writes`).

    Rollouts that fail the task are kept (check ``reward``); an oracle that
    raises, returns a turn longer than ``max_new_tokens``, or an episode that
    ends as an infrastructure failure raises ``RuntimeError``. Runs its own
    event loop; inside one, await :func:`acollect_demonstrations`.
    """
    return asyncio.run(acollect_demonstrations(
        env_id, tokenizer, oracle, episodes=episodes, seed=seed, env_kwargs=env_kwargs,
        template_format=template_format, **agent_kwargs,
    ))


# ---------------------------------------------------------------------------
# a run's demonstrations
# ---------------------------------------------------------------------------


class Demonstrations:
    """A run's demonstrations as its :class:`~sao_gym.runtime.plans.DemonstrationPlan` says.

    A file's conversations are read (and checked) once, when this is made.
    """

    def __init__(self, plan: DemonstrationPlan):
        self.plan = plan
        self.conversations = (load_conversations(plan.conversations)
                              if plan.conversations is not None else None)

    @property
    def what(self) -> str:
        """In words, for the run's output."""
        if self.conversations is not None:
            return f"{len(self.conversations)} conversations of {self.plan.conversations}"
        return self.plan.what

    def collect(self, tokenizer: Any, *, budgets: Mapping[str, int | None],
                episodes: int | None = None, holdout: int | None = None
                ) -> tuple[list[Rollout], list[Rollout]]:
        """``(training, held-out)`` demonstrations as token-exact rollouts.

        ``budgets``: the agent's ``max_new_tokens`` and ``max_context_tokens``.
        ``episodes`` / ``holdout``: how many (default: the plan's). A file's
        conversations are all played; its last ``holdout`` (at most a quarter)
        are held out.
        """
        plan = self.plan
        episodes = plan.episodes if episodes is None else episodes
        holdout = plan.holdout_episodes if holdout is None else holdout
        kwargs = {**budgets, "tool_schemas": plan.tool_schemas,
                  "template_format": plan.template_format}
        if self.conversations is not None:
            convs = self.conversations
            held = min(holdout, len(convs) // 4)
            played = collect_demonstrations(replay_env_factory(convs, self.env_tools()),
                                            tokenizer, replay_oracle, episodes=len(convs),
                                            **kwargs)
            return played[:len(convs) - held], played[len(convs) - held:]
        assert plan.oracle is not None
        if plan.harness is not None:
            return asyncio.run(_harness_demonstrations(plan, tokenizer, budgets, episodes,
                                                       holdout))
        train = collect_demonstrations(plan.env, tokenizer, plan.oracle, episodes=episodes,
                                       seed=plan.seed + DEMO_SEED_OFFSET, **kwargs)
        held_out = (collect_demonstrations(plan.env, tokenizer, plan.oracle, episodes=holdout,
                                           seed=plan.seed + HOLDOUT_SEED_OFFSET, **kwargs)
                    if holdout else [])
        return train, held_out

    def env_tools(self) -> list[Any]:
        """The tool schemas the run's env declares at reset."""
        env = self.plan.env()
        try:
            return list(env.reset(seed=self.plan.seed)[1].get("tools") or [])
        finally:
            env.close()


UNBOUNDED = 1 << 20
"""A demonstration's context when none is given (the tokenizer's corpus episodes)."""

HARNESS_DEMOS_AT_ONCE = 8
"""Harness demonstrations played at once (their harnesses' time overlaps)."""


async def _harness_demonstrations(plan: DemonstrationPlan, tokenizer: Any,
                                  budgets: Mapping[str, int | None], episodes: int,
                                  holdout: int) -> tuple[list[Rollout], list[Rollout]]:
    """The oracle's episodes through the run's harness (its prompt format), train and held out."""
    from sao_gym.evaluation import play_seeds
    from sao_gym.gateway.rollouts import HarnessRollouts

    made = plan.harness
    runs = HarnessRollouts(made.harness, made.tasks, None, tokenizer,
                           max_new_tokens=budgets["max_new_tokens"],
                           max_context_tokens=budgets.get("max_context_tokens") or UNBOUNDED)
    try:
        async def played(first: int, n: int) -> list[Rollout]:
            if not n:
                return []
            return await play_seeds(
                lambda s: runs.demonstrate(s, plan.oracle, template_format=plan.template_format),
                n, concurrency=HARNESS_DEMOS_AT_ONCE, seed=first)

        train = await played(plan.seed + DEMO_SEED_OFFSET, episodes)
        return train, await played(plan.seed + HOLDOUT_SEED_OFFSET, holdout)
    finally:
        await runs.aclose()


__all__ = [
    "Demonstrations",
    "Oracle",
    "acollect_demonstrations",
    "collect_demonstrations",
]
