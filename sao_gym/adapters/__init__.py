"""Adapters to other RL tools: TRL, OpenEnv (both ways), verifiers, Harbor task directories.

Each adapter module imports its tool's package only when used (the extras
``trl``, ``openenv``, ``verifiers``); what they share lives here:

- :mod:`sao_gym.adapters.loop`: the background event loop that owns wrapped
  environments, so their sync API works from inside another event loop;
- :mod:`sao_gym.adapters.session`: :class:`EnvSession`, one episode driven one
  tool call at a time, with the episode's reward and stop reason;
- :mod:`sao_gym.adapters.callables`: JSON-schema tools as typed Python
  functions (what TRL, FastMCP and MCP read).
"""

from sao_gym.adapters.callables import comparable, signature_schema, tool_function
from sao_gym.adapters.loop import BackgroundLoop, shared_loop
from sao_gym.adapters.session import EnvSession, StepOutcome

__all__ = ["BackgroundLoop", "EnvSession", "StepOutcome", "comparable", "shared_loop",
           "signature_schema", "tool_function"]
