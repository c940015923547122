r"""Tool-integrated math reasoning: ``sao_gym/MathTIR-v0``.

Tools ``python(code)`` (sandboxed) and ``submit_answer(answer)``, or a final
``\boxed{}`` answer; graded by math-verify under our own time bound. Tasks
from reasoning-gym generators or the user's JSONL / ``datasets`` files.
"""

from sao_gym.envs.math_tir.data import ReasoningGymTasks, load_tasks
from sao_gym.envs.math_tir.env import MathTIREnv
from sao_gym.envs.math_tir.verify import GradeResult, grade_answer

__all__ = ["GradeResult", "MathTIREnv", "ReasoningGymTasks", "grade_answer", "load_tasks"]
