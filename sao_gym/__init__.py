"""sao_gym: agentic Gymnasium environments and SAO training for LLM agents.

Importing ``sao_gym`` registers the built-in environments on Gymnasium's
registry and stays light (no torch import: training is the ``train`` extra).
Ids of other modules and packages (``"module:id"``, the ``sao_gym.envs``
entry points) resolve in :func:`make`; see :mod:`sao_gym.registration`.

Example:
    >>> import sao_gym
    >>> env = sao_gym.make("sao_gym/Arithmetic-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs[-1]["role"]
    'user'
    >>> env.close()

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
