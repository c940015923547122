"""Multi-turn arithmetic with tools: ``sao_gym/Arithmetic-v0``."""

from sao_gym.envs.arithmetic.env import ArithmeticEnv

__all__ = ["ArithmeticEnv"]
