"""A long-horizon key chain with a horizon knob: ``sao_gym/KeyChain-v0``."""

from sao_gym.envs.key_chain.env import KeyChainEnv

__all__ = ["KeyChainEnv"]
