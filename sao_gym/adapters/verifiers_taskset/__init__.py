"""The verifiers taskset package of sao_gym: ``vf-eval sao-gym-verifiers --env.taskset.env ID``.

verifiers (0.4) resolves a taskset id to a top-level module exporting one
``Taskset`` subclass in ``__all__`` (plus, optionally, its ``Env`` and default
``Harness``); this is that module for every registered sao_gym env. The code
lives in :mod:`sao_gym.adapters.verifiers`.
"""

from sao_gym.adapters.verifiers import SaoGymEnv, SaoGymHarness, SaoGymTaskset

__all__ = ["SaoGymEnv", "SaoGymHarness", "SaoGymTaskset"]
