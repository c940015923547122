"""Repository repair with hidden tests, SWE-bench style: ``sao_gym/CodeRepo-v0``.

Tasks: HumanEval problems as one-module repositories, bugs injected into real
packages and validated against their own test suites, and SWE-bench / SWE-Gym
instances. See docs/envs/code_repo.md.
"""

from sao_gym.envs.code_repo.env import CodeRepoEnv
from sao_gym.envs.code_repo.sources import load_tasks
from sao_gym.envs.code_repo.tasks import RepoTask, SweSpec

__all__ = ["CodeRepoEnv", "RepoTask", "SweSpec", "load_tasks"]
