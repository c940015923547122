"""A synthetic environment with heavy-tailed episode lengths and step latencies."""

from sao_gym.envs.latency.env import HeavyTailEnv

__all__ = ["HeavyTailEnv"]
