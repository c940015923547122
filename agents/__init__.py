"""Agents (installed as ``sao_gym.agents``): LLM-driven, scripted and random."""

from sao_gym.agents.llm import LLMAgent
from sao_gym.agents.scripted import RandomAgent, ScriptedAgent
from sao_gym.agents.tool_parser import parse_tool_calls

__all__ = ["LLMAgent", "RandomAgent", "ScriptedAgent", "parse_tool_calls"]
