"""Harness episodes as rollouts: the user's agent, trained through the gateway.

:class:`HarnessRollouts` is the ``play(seed, sample_seed)`` of a run whose
agent is a harness (:mod:`sao_gym.gateway.harness`): it serves a
:class:`~sao_gym.gateway.app.Gateway` over the run's backend on a local port,
and for each episode

1. takes the task of ``seed`` (:class:`~sao_gym.gateway.tasks.TaskSource`),
   opens a gateway episode sampling with ``sample_seed`` and runs the harness
   against its base URL, under the harness's time limit;
2. ends the episode (a later call of the harness gets 409) and takes its
   reward: the verifier's (``agent.reward``) if the run names one, else the
   one posted to ``/episodes/ID/reward``, else what the harness returned;
3. returns the episode's segments as one :class:`~sao_gym.types.Rollout`
   (``segment_starts``), trained under that reward.

As for env episodes, failures are data. A harness that crashes, times out,
makes no model call or gives no reward, and a verifier that fails, make an
infrastructure failure (``AGENT_ERROR``; the rollout source retries it and
never trains on it), logged with the reason. A call that did not fit the
context ends the episode as truncated (``MAX_TOKENS``) whatever the harness
did next: the policy's own doing, trained on with the reward it got (0 if none).

Every call samples at the run's temperature and top-p (the learner scores
the tokens at the run's temperature), at most ``max_new_tokens`` tokens a call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from sao_gym.gateway.app import MAX_BODY, Gateway
from sao_gym.gateway.episode import ChatEpisode
from sao_gym.gateway.harness import Harness, HarnessFailed, LocalHarness, as_reward, verifier
from sao_gym.gateway.tasks import TaskSource, oracle_task
from sao_gym.gateway.workers import HarnessWorkers
from sao_gym.inference.base import SamplesOn
from sao_gym.inference.oracle import Oracle
from sao_gym.types import Rollout, StopReason, Trajectory

logger = logging.getLogger(__name__)

MODEL = "policy"
"""The model name harnesses ask for (any name the gateway serves: see :attr:`models`)."""


class HarnessRollouts(SamplesOn):
    """The episodes of a harness run in one process (module docs).

    Args:
        harness: the user's agent.
        tasks: seed -> task.
        backend: the run's inference backend (None: only :meth:`demonstrate`).
        tokenizer: its tokenizer, with the chat template.
        max_new_tokens: tokens one call may sample.
        max_context_tokens: tokens of one segment.
        temperature, top_p: how every call samples.
        reward: ``MODULE:NAME`` of a verifier (:func:`~sao_gym.gateway.harness.verifier`),
            or None.
        models: names a harness may ask for (the first is the run's).
        workers: worker processes that run a program harness's episodes
            (:class:`~sao_gym.gateway.workers.HarnessWorkers`); 0: this process's
            event loop runs them.

    """

    def __init__(self, harness: Harness, tasks: TaskSource, backend: Any, tokenizer: Any, *,
                 max_new_tokens: int, max_context_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, reward: str | None = None,
                 models: tuple[str, ...] = (MODEL, "gpt-4o-mini", "gpt-4o", "gpt-4.1"),
                 workers: int = 0):
        self.harness, self.tasks, self.backend = harness, tasks, backend
        self.tokenizer = tokenizer
        self.gateway = Gateway(backend, tokenizer, models=lambda: models,
                               max_context_tokens=max_context_tokens,
                               max_new_tokens=max_new_tokens, sampling=(temperature, top_p))
        self.verifier = verifier(reward) if reward is not None else None
        self._task_list = tasks.load()
        self._episodes = HarnessWorkers(harness, workers) if workers else LocalHarness(harness)
        self._runner: Any = None
        self._url: str | None = None

    async def url(self) -> str:
        """The gateway's local address (started on first use)."""
        from aiohttp import web

        if self._url is None:
            app = web.Application(client_max_size=MAX_BODY)
            app.add_routes(self.gateway.routes())
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            if self._url is None:
                port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
                self._runner, self._url = runner, f"http://127.0.0.1:{port}"
            else:  # another episode started it meanwhile
                await runner.cleanup()
        return self._url

    async def play(self, seed: int, sample_seed: int | None = None,
                   env_kwargs: Mapping[str, Any] | None = None) -> Rollout:
        """One harness episode on the task of ``seed`` (module docs); never raises for it.

        ``env_kwargs`` override the options of an env's task (a curriculum's level);
        tasks from a file have none, and raise ``ValueError``.
        """
        return await self._episode(seed, sample_seed, env_kwargs=env_kwargs)

    async def demonstrate(self, seed: int, oracle: Oracle, *, template_format: bool = False
                          ) -> Rollout:
        """The harness's episode on the task of ``seed`` with ``oracle`` answering its calls.

        The oracle gets the conversation as the harness sends it and the task
        (:func:`~sao_gym.gateway.tasks.oracle_task`: an env's own task, its
        answer included); its turns are recorded as the policy's would be
        (``loss_mask`` 1), in the harness's own prompt format: a demonstration
        for the warm start. An oracle that fails, or an episode that is an
        infrastructure failure, raises ``RuntimeError``.
        """
        from sao_gym.inference.oracle import OracleTurns
        from sao_gym.inference.scripted import ScriptedBackend

        turns = OracleTurns(self.tokenizer, oracle, template_format)
        turns.task = await oracle_task(self.tasks.task(seed, self._task_list)[1])
        rollout = await self._episode(seed, None, backend=ScriptedBackend(turns), turns=turns)
        if turns.error is not None:
            raise RuntimeError(f"the oracle failed on task seed {seed}: {turns.error}"
                               ) from turns.error
        if rollout.infra_failure:
            raise RuntimeError(f"the demonstration on task seed {seed} ended as an infra "
                               "failure; the log above says why")
        return rollout

    async def _episode(self, seed: int, sample_seed: int | None, *, backend: Any = None,
                       turns: Any = None, env_kwargs: Mapping[str, Any] | None = None
                       ) -> Rollout:
        task_id, task = self.tasks.task(seed, self._task_list)
        if env_kwargs:
            if "env_kwargs" not in task:
                raise ValueError("env options (a curriculum's level) apply to an env's tasks, "
                                 "not to tasks from a file")
            task = {**task, "env_kwargs": {**task["env_kwargs"], **env_kwargs}}
        episode_id = uuid.uuid4().hex
        base = await self.url()
        opened = self.gateway.new_episode(episode_id, seed=sample_seed, backend=backend)
        if turns is not None:
            turns.agent = opened  # the oracle reads the episode's conversation
        failure: str | None = None
        returned: float | None = None
        try:
            returned = await asyncio.wait_for(
                self._episodes.run(f"{base}/episodes/{episode_id}/v1", task),
                self.harness.timeout_s)
        except TimeoutError:
            failure = f"the harness ran past its {self.harness.timeout_s:g} s"
        except HarnessFailed as e:
            failure = str(e)
        finally:
            episode = self.gateway.end_episode(episode_id)
        if failure is None and not episode.exhausted:
            reward, failure = await self._reward(episode, task, returned)
        else:
            reward = episode.reward if episode.reward is not None else returned
        return self._rollout(episode, seed, task_id, reward, failure)

    async def _reward(self, episode: ChatEpisode, task: dict[str, Any],
                      returned: float | None) -> tuple[float | None, str | None]:
        if self.verifier is not None:
            try:
                value = self.verifier(task, episode.transcript())
                if inspect.isawaitable(value):
                    value = await value
                value = as_reward(value, where="agent.reward")
            except Exception as e:  # the verifier is user code: its failure is data
                return None, f"the verifier failed: {type(e).__name__}: {e}"
            return (value, None) if value is not None else (None, "the verifier gave None")
        value = episode.reward if episode.reward is not None else returned
        if value is None:
            return None, ("the harness gave no reward (return one, POST it to "
                          "/episodes/ID/reward, or name a verifier with agent.reward)")
        return value, None

    def _rollout(self, episode: ChatEpisode, seed: int, task_id: str, reward: float | None,
                 failure: str | None) -> Rollout:
        segments = [t for t in episode.segments() if any(t.loss_mask)]
        if failure is None and not segments:
            failure = "the harness made no model call"
        if failure is not None and not episode.exhausted:
            logger.warning("harness episode on task %s (seed %d): an infra failure: %s",
                           task_id, seed, failure)
            stop, truncated = StopReason.AGENT_ERROR, False
        elif episode.exhausted:
            stop, truncated = StopReason.MAX_TOKENS, True
        else:
            stop, truncated = StopReason.TERMINATED, False
        joined, starts = _join(segments)
        infra = stop is StopReason.AGENT_ERROR
        return Rollout(
            token_ids=joined.token_ids, loss_mask=joined.loss_mask,
            rollout_logprobs=joined.logprobs, policy_versions=joined.policy_versions,
            reward=float(reward or 0.0) if not infra else 0.0,
            terminated=stop is StopReason.TERMINATED, truncated=truncated, stop_reason=stop,
            infra_failure=infra, messages=episode.transcript(), env_id=self.tasks.env or "",
            task_id=task_id, seed=seed, segment_starts=starts,
            metrics={"turns": float(episode.calls), "segments": float(len(segments)),
                     "action_tokens": float(sum(joined.loss_mask)),
                     "total_tokens": float(len(joined.token_ids)),
                     "sampling_overridden": float(episode.overridden)})

    async def aclose(self) -> None:
        """Stop the harness workers and the gateway; release the backend."""
        await self._episodes.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner, self._url = None, None
        if self.backend is not None:
            await self.backend.aclose()


def _join(segments: list[Trajectory]) -> tuple[Trajectory, list[int]]:
    """Segments laid end to end, and where each after the first starts."""
    out = Trajectory()
    starts = []
    for t in segments:
        if out.token_ids:
            starts.append(len(out.token_ids))
        out.token_ids.extend(t.token_ids)
        out.loss_mask.extend(t.loss_mask)
        out.logprobs.extend(t.logprobs)
        out.policy_versions.extend(t.policy_versions)
    return out, starts


__all__ = ["MODEL", "HarnessRollouts"]
