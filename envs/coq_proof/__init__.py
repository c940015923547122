"""Theorem proving in Coq: ``sao_gym/CoqProof-v0``."""

from sao_gym.envs.coq_proof.checker import CheckResult, CoqChecker, ScriptRejected, prepare_script
from sao_gym.envs.coq_proof.env import CoqProofEnv
from sao_gym.envs.coq_proof.tasks import (
    CoqTask,
    bundled_tasks,
    load_jsonl,
    load_v_files,
    tasks_from_v,
)

__all__ = [
    "CheckResult",
    "CoqChecker",
    "CoqProofEnv",
    "CoqTask",
    "ScriptRejected",
    "bundled_tasks",
    "load_jsonl",
    "load_v_files",
    "prepare_script",
    "tasks_from_v",
]
