"""Any registered environment as a verifiers (PrimeIntellect-ai/verifiers) taskset.

verifiers 0.4 (``verifiers.v1``) splits an environment into a *taskset* (task
data, ``@vf.reward``/``@vf.stop`` hooks) and MCP *toolsets* that a *harness*
(the agent's chat loop) calls. This module maps a sao_gym env onto that:

- :class:`SaoGymTaskset`: one task per seed. Loading resets the env once per
  seed, so each :class:`SaoGymData` carries the env id, seed, env kwargs, the
  env's tool schemas and its first messages as the prompt (a leading system
  message becomes ``system_prompt``, which ``--env.taskset.system-prompt``
  overrides).
- :class:`SaoGymToolset`: the task-scoped MCP server, launched by verifiers
  per rollout (``python -m sao_gym.adapters.verifiers``). ``setup_task`` makes
  one :class:`~sao_gym.adapters.session.EnvSession` and resets it with the
  task's seed; it advertises the env's ``info["tools"]`` unchanged (names,
  descriptions, raw JSON schemas) and runs each tool call as one env step,
  returning the observation text. The episode record (total reward,
  terminated/truncated, stop reason, infra failure) travels to the rollout
  in :class:`SaoGymState` over verifiers' state channel.
- :class:`SaoGymTask`: ``@vf.stop`` ends the rollout once the env terminated
  or truncated; ``@vf.reward`` ``env_reward`` is the episode's total env
  reward; an infra failure (``ENV_ERROR``) raises there instead, so verifiers
  records a ``TaskError`` on the trace (``ok`` false, reward ``None``) rather
  than a silent 0.
- :class:`SaoGymEnv`: the run's env (verifiers picks it up from the taskset
  package): tool envs run as a plain single-agent rollout; a text env (no
  tools) is stepped host-side with each final reply, its observation coming
  back as the next user turn. Its agent runs as a local subprocess by default.
- :class:`SaoGymHarness`: the default harness, verifiers' plain chat loop
  (``null``: MCP tools only, no bash).

The taskset package verifiers imports is the top-level ``sao_gym_verifiers``
(verifiers resolves a taskset id to a top-level module), so::

    vf-eval sao-gym-verifiers --env.taskset.env ENV_ID -n 8
        -m MODEL --client.base-url http://127.0.0.1:8000/v1 --no-push

See docs/interop.md for what does not carry over.
"""

import asyncio
import logging
import signal
import sys
from collections.abc import Iterable, Iterator
from typing import Any

try:
    import verifiers.v1 as vf
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import CallToolResult, TextContent, Tool
    from pydantic import Field, TypeAdapter
    from verifiers.v1.harnesses.null import NullHarness
except ImportError as e:  # pragma: no cover - exercised in the main test venv
    raise ImportError("sao_gym.adapters.verifiers needs verifiers 0.4: "
                      f"pip install 'sao-gym[verifiers]' ({e})") from e

from sao_gym.adapters.session import EnvSession, StepOutcome, observation_text

logger = logging.getLogger(__name__)

TASKSET_ID = "sao-gym-verifiers"
"""The taskset id verifiers resolves to the ``sao_gym_verifiers`` package."""

_MESSAGES = TypeAdapter(vf.Messages)


# ----- data and config -----
class SaoGymData(vf.TaskData):
    """One task: an env id and a seed (plus what the first reset showed)."""

    env_id: str
    """The registered env id (``my_ns/MyEnv-v0``, ``module:id``)."""
    seed: int
    """The reset seed of this task."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor options of the env (JSON values)."""
    max_episode_steps: int | None = None
    """The turn limit given to :func:`sao_gym.make` (None: the registration's)."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The env's OpenAI tool schemas at reset (empty: a text env)."""


class SaoGymState(vf.State):
    """The episode record the tool server (or the text-env loop) shares with the rollout."""

    started: bool = False
    steps: int = 0
    reward: float = 0.0
    """Total env reward so far."""
    step_rewards: list[float] = Field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    done: bool = False
    stop_reason: str | None = None
    infra_failure: bool = False
    error: str | None = None


class SaoGymToolsetConfig(vf.ToolsetConfig):
    """Placement (``runtime``, ``colocated``) plus the env's time limits."""

    reset_timeout: float = Field(600.0, gt=0)
    """Seconds the per-rollout reset may take."""
    step_timeout: float = Field(300.0, gt=0)
    """Seconds one env step may take (beyond it: an infra failure)."""


class SaoGymTaskConfig(vf.TaskConfig):
    """Run-time knobs of each task (``--env.taskset.task.*``)."""

    tools: SaoGymToolsetConfig = SaoGymToolsetConfig()
    toolset: bool = True
    """Launch the env's tool server per rollout; the taskset turns it off for a text env."""


class SaoGymConfig(vf.TasksetConfig):
    """Which env and seeds (``--env.taskset.*``)."""

    env: str = ""
    """Registered env id, e.g. ``my_ns/MyEnv-v0`` or ``module:id`` (required)."""
    seeds: list[int] | None = None
    """Explicit seeds, one task each; unset: ``first_seed`` .. ``first_seed + num_tasks - 1``."""
    first_seed: int = 0
    num_tasks: int = Field(100, ge=1)
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Constructor options of the env (JSON values)."""
    max_episode_steps: int | None = Field(None, ge=1)
    """Turn limit (None: the registration's)."""
    task: SaoGymTaskConfig = SaoGymTaskConfig()


# ----- the MCP toolset (one server per rollout) -----
class SaoGymToolset(vf.Toolset[SaoGymToolsetConfig, SaoGymState]):
    """The env's tools over MCP, one env step per call (see module docs)."""

    TOOL_PREFIX = None  # the env's own tool names, unprefixed

    def __init__(self, config: SaoGymToolsetConfig) -> None:
        super().__init__(config)
        self.session: EnvSession | None = None
        self.tools: list[dict[str, Any]] = []
        self.setup_error: str | None = None
        """Why the reset failed (then the server runs with no tools and says so)."""

    async def setup(self) -> None:
        """Turn SIGTERM (how verifiers stops the server) into a clean exit that closes the env."""
        if sys.platform != "win32":
            signal.signal(signal.SIGTERM, _exit_on_signal)

    async def setup_task(self, task: SaoGymData) -> None:
        """Make this rollout's env and reset it with the task's seed.

        A failed reset does not stop the server (verifiers would only notice after
        its start-up probe gives up): the first MCP request reports it as an
        infra failure instead, which ends the rollout as a TaskError.
        """
        self.session = EnvSession(task.env_id, max_episode_steps=task.max_episode_steps,
                                  **task.env_kwargs)
        self._exit_stack.push_async_callback(self.session.aclose)
        try:
            await asyncio.wait_for(self.session.areset(seed=task.seed),
                                   self.config.reset_timeout)
        except Exception as e:  # noqa: BLE001 - reported to the rollout (see above)
            logger.exception("resetting %s (seed %s) failed", task.env_id, task.seed)
            self.setup_error = f"the reset failed ({type(e).__name__}: {e})"[:2000]
        self.tools = self.session.tools

    def register(self, mcp: MCPServer) -> None:
        """Serve the env's raw tool catalog (as verifiers' NeMo Gym toolset does)."""
        server: Any = mcp
        server.list_tools = self._with_state(self.list_tools)
        server.call_tool = self._with_state(self.call_tool)

    async def list_tools(self) -> list[Tool]:
        """The env's ``info["tools"]`` as MCP tools, schemas unchanged."""
        self._report_setup_error()
        out = []
        for schema in self.tools:
            fn = schema.get("function", schema)
            out.append(Tool(name=fn["name"], description=fn.get("description") or None,
                            input_schema=fn.get("parameters") or {"type": "object"}))
        return out

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context | None = None) -> CallToolResult:
        """One env step with this call; the observation text is the result."""
        if self.session is None:
            raise RuntimeError("the tool server has no env: setup_task did not run")
        if self._report_setup_error():
            return CallToolResult(content=[TextContent(type="text", text=self.setup_error)],
                                  is_error=True)
        outcome = await self.session.acall_tool(name, arguments, timeout=self.config.step_timeout)
        record(self.state, self.session, outcome)
        failed = bool(outcome.info.get("infra_failure") or outcome.info.get("episode_over"))
        return CallToolResult(content=[TextContent(type="text", text=outcome.text)],
                              is_error=failed)


    def _report_setup_error(self) -> bool:
        if self.setup_error is None:
            return False
        self.state.infra_failure = self.state.done = True
        self.state.stop_reason, self.state.error = "env_error", self.setup_error
        return True


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def record(state: SaoGymState, session: EnvSession, outcome: StepOutcome | None = None) -> None:
    """Copy ``session``'s episode record into ``state``."""
    state.started = session.started
    state.steps = session.turns
    state.reward = float(session.reward)
    if outcome is not None and not (outcome.info.get("episode_over")
                                    or outcome.info.get("infra_failure")):
        state.step_rewards.append(float(outcome.reward))
    state.terminated, state.truncated = session.terminated, session.truncated
    state.done = session.stop_reason is not None
    state.stop_reason = session.stop_reason.value if session.stop_reason else None
    state.infra_failure = session.infra_failure
    if session.infra_failure and outcome is not None and state.error is None:
        state.error = outcome.text[:2000]


# ----- task and taskset -----
class SaoGymTask(vf.Task[SaoGymData, SaoGymState, SaoGymTaskConfig]):
    """A seed of an env: its toolset, stop and reward (see module docs)."""

    @classmethod
    def toolsets(cls, config: SaoGymTaskConfig) -> list[vf.Toolset]:
        """One :class:`SaoGymToolset` per rollout (none for a text env)."""
        return [SaoGymToolset(config.tools)] if config.toolset else []

    @vf.stop
    async def env_done(self, trace: vf.Trace) -> bool:
        """The env terminated or truncated the episode."""
        return bool(trace.state.done)

    @vf.reward(weight=1.0)
    async def env_reward(self, trace: vf.Trace) -> float:
        """The episode's total env reward; raises on an infra failure (a TaskError)."""
        state: SaoGymState = trace.state
        trace.info["sao_gym"] = {"env_id": self.data.env_id, "seed": self.data.seed,
                                 "stop_reason": state.stop_reason,
                                 "terminated": state.terminated, "truncated": state.truncated,
                                 "step_rewards": state.step_rewards}
        if state.infra_failure:
            raise RuntimeError(f"infrastructure failure of {self.data.env_id} "
                               f"(seed {self.data.seed}): {state.error or 'env_error'}")
        return state.reward

    @vf.metric
    async def env_episode(self, trace: vf.Trace) -> dict[str, float]:
        """Env steps and how the episode ended, as metrics."""
        state: SaoGymState = trace.state
        return {"env_steps": float(state.steps), "terminated": float(state.terminated),
                "truncated": float(state.truncated)}


class SaoGymTaskset(vf.Taskset[SaoGymTask, SaoGymConfig]):
    """The seeds of a registered env as verifiers tasks (see module docs)."""

    def load(self) -> Iterator[SaoGymTask]:
        """Reset the env once per seed and yield its task (lazily: ``-n`` resets only ``n``)."""
        settings = self.config
        if not settings.env:
            raise ValueError("set the env: --env.taskset.env <registered id> (`sao-gym envs` "
                             "lists them)")
        seeds = settings.seeds if settings.seeds is not None else \
            range(settings.first_seed, settings.first_seed + settings.num_tasks)
        session = EnvSession(settings.env, max_episode_steps=settings.max_episode_steps,
                             **settings.env_kwargs)
        text_env = settings.task.model_copy(update={"toolset": False})
        try:
            for seed in seeds:
                messages, info = session.reset(seed=seed)
                data = task_data(settings, seed, messages, info)
                yield SaoGymTask(data, settings.task if data.tools else text_env)
        finally:
            session.close()


def task_data(config: SaoGymConfig, seed: int, messages: list[dict[str, Any]],
              info: dict[str, Any]) -> SaoGymData:
    """The :class:`SaoGymData` of ``seed`` from its reset ``messages`` and ``info``."""
    system = None
    rest = [m for m in messages if m.get("content") is not None or m.get("tool_calls")]
    if rest and rest[0].get("role") == "system" and isinstance(rest[0].get("content"), str):
        system, rest = rest[0]["content"], rest[1:]
    prompt: str | list[Any] | None = None
    if len(rest) == 1 and rest[0].get("role") == "user" and isinstance(rest[0]["content"], str):
        prompt = rest[0]["content"]
    elif rest:
        prompt = _MESSAGES.validate_python(rest)
    task_id = f"{config.env}@{seed}"
    return SaoGymData(id=task_id, name=str(info.get("task_id") or task_id), prompt=prompt,
                      system_prompt=system, env_id=config.env, seed=seed,
                      env_kwargs=dict(config.env_kwargs),
                      max_episode_steps=config.max_episode_steps,
                      tools=list(info.get("tools") or []))


def load_taskset(env_id: str, seeds: Iterable[int] | None = None, *, num_tasks: int = 100,
                 first_seed: int = 0, max_episode_steps: int | None = None,
                 task: SaoGymTaskConfig | None = None, **env_kwargs: Any) -> SaoGymTaskset:
    """A :class:`SaoGymTaskset` of ``env_id`` from Python (``seeds``, else a range)."""
    return SaoGymTaskset(SaoGymConfig(
        id=TASKSET_ID, env=env_id, seeds=list(seeds) if seeds is not None else None,
        num_tasks=num_tasks, first_seed=first_seed, max_episode_steps=max_episode_steps,
        env_kwargs=env_kwargs, task=task or SaoGymTaskConfig()))


# ----- env and harness -----
class SaoGymEnvConfig(vf.EnvConfig):
    """The one ``agent`` seat, a local subprocess by default (``--env.agent.*``)."""

    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class SaoGymEnv(vf.Env[SaoGymEnvConfig]):
    """One agent per episode; a text env is stepped here with each final reply."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        """Play ``task``: a tool env through its toolset, a text env turn by turn."""
        data: SaoGymData = task.data
        if data.tools:
            await agents.agent.run(task)
            return
        timeouts = task.config.tools
        session = EnvSession(data.env_id, max_episode_steps=data.max_episode_steps,
                             **data.env_kwargs)
        try:
            await asyncio.wait_for(session.areset(seed=data.seed), timeouts.reset_timeout)
            async with agents.agent.interaction(task) as interaction:
                state: SaoGymState = interaction.trace.state
                segment = await interaction.turn()
                while not segment.terminated:
                    outcome = await session.asend(segment.last_reply,
                                                  timeout=timeouts.step_timeout)
                    record(state, session, outcome)
                    if outcome.done:
                        break
                    segment = await interaction.turn(observation_text(outcome.messages))
        finally:
            await session.aclose()


class SaoGymHarness(NullHarness):
    """verifiers' plain chat loop (the ``null`` harness): the env's MCP tools, nothing else."""


if __name__ == "__main__":  # how verifiers launches the per-rollout tool server
    from sao_gym.adapters import verifiers as _module

    _module.SaoGymToolset.run()
