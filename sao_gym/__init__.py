"""sao_gym: agentic Gymnasium environments and SAO training for LLM agents.

Importing ``sao_gym`` registers the built-in environments on Gymnasium's
registry and stays light (no torch import: training is the ``train`` extra).
Ids of other modules and packages (``"module:id"``, the ``sao_gym.envs``
entry points) resolve in :func:`make`; see :mod:`sao_gym.registration`.

Example: an environment fills two hooks; register it, make it, play it.
    >>> import sao_gym
    >>> class Echo(sao_gym.AgentEnv):
    ...     async def on_reset(self, options):
    ...         return [{"role": "user", "content": "say hi"}], {}
    ...     async def on_step(self, action):
    ...         said = action["content"] if isinstance(action, dict) else action
    ...         return [], float(said == "hi"), True, False, {}
    >>> sao_gym.register("my_ns/Echo-v0", Echo, max_episode_steps=4)
    >>> env = sao_gym.make("my_ns/Echo-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs[-1]["content"]
    'say hi'
    >>> obs, reward, terminated, truncated, info = env.step("hi")
    >>> reward, terminated
    (1.0, True)
    >>> env.close()
    >>> sao_gym.registration.unregister("my_ns/Echo-v0")

"""

from sao_gym.core import (
    Agent,
    AgentEnv,
    AgentWrapper,
    ContextExhausted,
    ResetNeeded,
)
from sao_gym.registration import env_ids, make, register
from sao_gym.rollout import run_episode
from sao_gym.spaces import AssistantMessageSpace, ChatSpace
from sao_gym.tools import ToolEnv, ToolError, ToolResult, tool
from sao_gym.types import (
    Generation,
    Message,
    Rollout,
    SamplingParams,
    StopReason,
    Trajectory,
)

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentEnv",
    "AgentWrapper",
    "AssistantMessageSpace",
    "ChatSpace",
    "ContextExhausted",
    "Generation",
    "Message",
    "ResetNeeded",
    "Rollout",
    "SamplingParams",
    "StopReason",
    "ToolEnv",
    "ToolError",
    "ToolResult",
    "Trajectory",
    "env_ids",
    "make",
    "register",
    "run_episode",
    "tool",
]

# The built-in environments register themselves (with their oracles and hooks).
import sao_gym.envs  # noqa: E402,F401  (registrations only: no env module is imported)
