r"""Tool-integrated math reasoning: ``sao_gym/MathTIR-v0``.

Tools ``python(code)`` (sandboxed) and ``submit_answer(answer)``, or a final
``\boxed{}`` answer; graded by math-verify under our own time bound. Tasks
from reasoning-gym generators or the user's JSONL / ``datasets`` files.
"""

from sao_gym.registration import require_optional

# Grading (math-verify) and the sandboxed interpreter (sympy) need the `envs`
# extra whatever the tasks: say so before anything imports them.
require_optional("math_verify", "sympy", needed_by="sao_gym/MathTIR-v0")

from sao_gym.envs.math_tir.data import ReasoningGymTasks, load_tasks  # noqa: E402
from sao_gym.envs.math_tir.env import MathTIREnv  # noqa: E402
from sao_gym.envs.math_tir.verify import GradeResult, grade_answer  # noqa: E402

__all__ = ["GradeResult", "MathTIREnv", "ReasoningGymTasks", "grade_answer", "load_tasks"]
