r"""``sao_gym/MathTIR-v0``: tool-integrated math reasoning.

The agent sees a math question, may run Python code in a sandbox with
``python(code)`` as often as it likes, and ends the episode with
``submit_answer(answer)`` or with a plain message whose final answer is in
``\boxed{...}``. The answer is graded by :mod:`sao_gym.envs.math_tir.verify`
(math-verify with our own time bound, a sympy fallback, or the generator's
scorer). Tasks come from reasoning-gym generators (offline) or from a
user's data file (:mod:`sao_gym.envs.math_tir.data`). The episode's sandbox
comes from a :class:`~sao_gym.sandbox.SandboxPool` (``sandbox_pool``, or
:func:`~sao_gym.sandbox.shared_pool` of the spec): leased at reset, so it
starts while the model writes its first turn, awaited at the first ``python``
call, released (closed) at the next reset or ``close``.

Reward: ``(1 - format_weight) * correctness + format_weight * format``
(default: correctness alone). ``info["reward_components"]`` carries
``correctness`` (1 if the answer matches the reference) and ``format`` (1
if the answer came through ``submit_answer`` or ``\boxed{}`` and was not
empty).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sao_gym.core import StepResult, clean_text, error_observation
from sao_gym.envs.math_tir.data import (
    DEFAULT_GENERATORS,
    ReasoningGymTasks,
    load_tasks,
    task_from_dict,
)
from sao_gym.envs.math_tir.verify import MAX_ANSWER_CHARS, extract_boxed, grade_answer
from sao_gym.sandbox import EpisodeSandbox, ExecResult, Sandbox, SandboxPool, make_sandbox
from sao_gym.tools import ToolEnv, ToolError, ToolResult, tool
from sao_gym.types import Message

SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python code with the `python` tool: each call runs "
    "the code in a fresh Python 3 process{packages} and returns what it prints. When you know "
    "the answer, call `submit_answer` with the final answer alone, or write the final answer "
    "in \\boxed{{}}."
)
DEFAULT_SANDBOX_LIMITS = {"memory_mb": 1024, "pids": 64, "disk_mb": 64, "cpu_seconds": 60}
"""Limits of the episode's sandbox unless the ``sandbox`` spec sets its own."""
PLAIN_TEXT_MODES = ("continue", "grade")


class MathTIREnv(ToolEnv):
    r"""Math questions solved with a sandboxed ``python`` tool and ``submit_answer``.

    Args:
        generators: reasoning-gym generator names (default: gsm_symbolic,
            basic_arithmetic, chain_sum). Ignored when ``data_files`` is set.
        generator_configs: per-generator config kwargs.
        data_seed: seed of the generated datasets.
        tasks_per_generator: how many task indices each generator offers.
        data_files: a JSONL/JSON/Parquet/CSV/Arrow file or ``datasets``
            directory of question/answer records (see :func:`load_tasks`).
        question_key, answer_key, answer_format, id_key, split: how to read it.
        sandbox: where the code runs: ``"local"`` (bubblewrap), ``"docker"``,
            or a :func:`~sao_gym.sandbox.make_sandbox` mapping. Without
            ``limits`` in it, :data:`DEFAULT_SANDBOX_LIMITS` apply; its
            ``"pool"`` entry configures the shared pool
            (:data:`~sao_gym.sandbox.POOL_OPTIONS`).
        sandbox_pool: take sandboxes from this pool instead of the shared
            pool of ``sandbox`` (the caller owns it).
        sandbox_packages: host Python packages made importable (read-only)
            inside a local sandbox, whose interpreter otherwise has only the
            standard library. Docker sandboxes use their image's packages.
        python_timeout_s: wall-clock limit of one ``python`` call.
        max_output_chars: output shown per call (the rest is cut, with a note).
        max_code_chars: longest accepted code.
        verify_timeout_s: time bound of grading one answer.
        format_weight: weight of the format component in the reward.
        plain_text: a message without tool calls and without ``\boxed{}``:
            ``"continue"`` answers with an error and the episode goes on;
            ``"grade"`` grades the text as the final answer (format 0).
        system_prompt: replaces the default system message.

    """

    def __init__(
        self,
        *,
        generators: Sequence[str] = DEFAULT_GENERATORS,
        generator_configs: Mapping[str, Mapping[str, Any]] | None = None,
        data_seed: int = 0,
        tasks_per_generator: int = 100_000,
        data_files: str | os.PathLike[str] | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        answer_format: str = "auto",
        id_key: str | None = None,
        split: str = "train",
        sandbox: str | Mapping[str, Any] = "local",
        sandbox_pool: SandboxPool | None = None,
        sandbox_packages: Sequence[str] = ("sympy", "mpmath"),
        python_timeout_s: float = 10.0,
        max_output_chars: int = 4000,
        max_code_chars: int = 20_000,
        verify_timeout_s: float = 10.0,
        format_weight: float = 0.0,
        plain_text: str = "continue",
        system_prompt: str | None = None,
    ):
        super().__init__()
        _check_range("python_timeout_s", python_timeout_s, 0.1, 600)
        _check_range("max_output_chars", max_output_chars, 200, 1_000_000)
        _check_range("max_code_chars", max_code_chars, 100, 10_000_000)
        _check_range("verify_timeout_s", verify_timeout_s, 0.1, 600)
        _check_range("format_weight", format_weight, 0.0, 1.0)
        if plain_text not in PLAIN_TEXT_MODES:
            raise ValueError(f"plain_text must be one of {PLAIN_TEXT_MODES}, got {plain_text!r}")
        if system_prompt is not None and (not isinstance(system_prompt, str)
                                          or not system_prompt.strip()):
            raise ValueError("system_prompt must be a non-empty string")
        self.python_timeout_s = float(python_timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.max_code_chars = int(max_code_chars)
        self.verify_timeout_s = float(verify_timeout_s)
        self.format_weight = float(format_weight)
        self.plain_text = plain_text
        self._sandbox_spec, self._sandbox_env, bound = _sandbox_config(sandbox, sandbox_packages)
        packages = f" (packages: {', '.join(bound)})" if bound else ""
        self.system_prompt = system_prompt or SYSTEM_PROMPT.format(packages=packages)
        self.file_tasks: list[dict[str, Any]] | None = None
        self.generated: ReasoningGymTasks | None = None
        if data_files is not None:
            self.file_tasks = load_tasks(
                Path(data_files), question_key=question_key, answer_key=answer_key,
                answer_format=answer_format, id_key=id_key, split=split,
            )
        else:
            self.generated = ReasoningGymTasks(
                generators, data_seed=data_seed, size=tasks_per_generator,
                configs=generator_configs,
            )
        self.task: dict[str, Any] | None = None
        self._box = EpisodeSandbox(sandbox_pool, owner=self)
        self._metrics: dict[str, float] = {}

    # ----- episode life cycle -----
    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a task and start the episode; lease its sandbox (awaited at the first ``python``).

        ``options["task"]`` (prompt/answer), ``options["generator"]`` and/or
        ``options["index"]``, or else the seeded generator decide.
        """
        await self._box.release()
        self.task = self._choose_task(options)
        await self._box.lease(self._sandbox_spec)
        self._metrics = {"python_calls": 0.0, "python_s": 0.0, "verify_s": 0.0}
        obs: list[Message] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.task["prompt"]},
        ]
        return obs, {"task_id": self.task["id"]}

    def _choose_task(self, options: dict[str, Any]) -> dict[str, Any]:
        if "task" in options:
            return task_from_dict(options["task"])
        index = options.get("index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise ValueError(f'options["index"] must be an int, got {index!r}')
        if self.file_tasks is not None:
            if "generator" in options:
                raise ValueError('options["generator"] needs generated tasks, not data_files')
            if index is None:
                index = int(self.np_random.integers(len(self.file_tasks)))
            if not 0 <= index < len(self.file_tasks):
                raise ValueError(f"index must be in [0, {len(self.file_tasks)}), got {index}")
            return dict(self.file_tasks[index])
        assert self.generated is not None
        if "generator" in options or index is not None:
            generator = options.get("generator", self.generated.generators[0])
            if index is None:
                index = int(self.np_random.integers(self.generated.size))
            return self.generated.task(str(generator), index)
        return self.generated.sample(self.np_random)

    async def on_close(self) -> None:
        """Release (close) the episode's sandbox."""
        await self._box.release()

    async def _get_sandbox(self) -> Sandbox:
        """The episode's sandbox, started (a failed start raises its SandboxError)."""
        return await self._box.get()

    # ----- tools -----
    @tool(
        description=(
            "Run Python 3 code in a sandbox and return its output (stdout, stderr, exit "
            "status). Each call is a fresh process: print the values you need. Files written "
            "to the working directory persist for the episode. No network."
        ),
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "e.g. print(2**100)"}},
            "required": ["code"],
            "additionalProperties": False,
        },
    )
    async def python(self, code: str) -> ToolResult:
        """Run ``code`` in the episode's sandbox (a SandboxError propagates: infra failure)."""
        if not code.strip():
            raise ToolError("code is empty")
        if len(code) > self.max_code_chars:
            raise ToolError(f"code longer than {self.max_code_chars} characters")
        sandbox = await self._get_sandbox()
        start = time.perf_counter()
        result = await sandbox.run(
            ["python3", "-"], stdin=code.encode("utf-8", "replace"),
            timeout_s=self.python_timeout_s, env=self._sandbox_env or None,
            max_output_bytes=max(1 << 16, 4 * self.max_output_chars),
        )
        self._metrics["python_calls"] += 1
        self._metrics["python_s"] += time.perf_counter() - start
        memory = getattr(getattr(sandbox, "limits", None), "memory_mb", None)
        text = format_exec_result(result, timeout_s=self.python_timeout_s,
                                  memory_mb=memory, limit=self.max_output_chars)
        return ToolResult(text, info={"metrics": dict(self._metrics)})

    @tool(
        description=(
            "Submit the final answer (a number or a math expression, e.g. 42 or \\frac{3}{4}). "
            "This ends the episode."
        ),
        parameters={
            "type": "object",
            "properties": {"answer": {"type": ["string", "number"], "description": "e.g. 42"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    )
    async def submit_answer(self, answer: str | int | float) -> ToolResult:
        """Grade the answer and end the episode."""
        return await self._finish(str(answer), via="submit_answer")

    async def on_text(self, message: Message) -> StepResult:
        r"""A message without tool calls: a ``\boxed{}`` answer ends the episode."""
        content = message.get("content") or ""
        if extract_boxed(content) is not None:
            result = await self._finish(content, via="boxed")
        elif self.plain_text == "grade" and content.strip():
            result = await self._finish(content[-MAX_ANSWER_CHARS:], via="text")
        else:
            obs = error_observation(
                "no tool call and no final answer. Call `python` to run code or "
                "`submit_answer` to answer, or write the final answer in \\boxed{}."
            )
            return obs, 0.0, False, False, {"invalid_action": True}
        return [{"role": "user", "content": result.content}], result.reward, True, False, \
            result.info

    async def _finish(self, text: str, *, via: str) -> ToolResult:
        assert self.task is not None
        boxed = extract_boxed(text)
        answer = (boxed if boxed is not None else text).strip()
        grade = await grade_answer(answer, self.task, timeout_s=self.verify_timeout_s,
                                   free_text=via == "text" and boxed is None)
        correctness = 1.0 if grade.correct else 0.0
        form = 1.0 if via in ("submit_answer", "boxed") and answer else 0.0
        reward = (1.0 - self.format_weight) * correctness + self.format_weight * form
        self._metrics["verify_s"] += grade.seconds
        info = {
            "reward_components": {"correctness": correctness, "format": form},
            "metrics": dict(self._metrics),
            "grading": {"method": grade.method, "parsed": grade.parsed, "via": via,
                        "detail": grade.detail, "timed_out": grade.timed_out},
        }
        return ToolResult("Correct." if grade.correct else "Incorrect.", terminated=True,
                          reward=reward, info=info)


def format_exec_result(result: ExecResult, *, timeout_s: float, memory_mb: int | None,
                       limit: int) -> str:
    """The tool message for one run: status line, then stdout and stderr, each bounded.

    A clean run with no stderr is just its stdout. Stdout keeps its head,
    stderr its tail (where a traceback ends), within ``limit`` characters.
    """
    status = ""
    if result.timed_out:
        status = f"Error: the code ran longer than {timeout_s:g} s and was killed."
    elif result.oom_killed:
        size = f" (limit {memory_mb} MiB)" if memory_mb else ""
        status = f"Error: the code ran out of memory{size}."
    elif result.exit_code != 0:
        status = f"Error: exit status {result.exit_code}."
    if not status and not result.stderr:
        out = _clip(result.stdout, limit, keep="head", truncated=result.output_truncated)
        return out or "(no output: print() the values you want to see)"
    parts = [status] if status else []
    out_limit = limit // 2 if result.stderr else limit
    if result.stdout:
        parts.append("[stdout]\n" + _clip(result.stdout, out_limit, keep="head",
                                          truncated=result.output_truncated))
    if result.stderr:
        parts.append("[stderr]\n" + _clip(result.stderr, limit - min(len(result.stdout),
                                                                     out_limit),
                                          keep="tail", truncated=result.output_truncated))
    return "\n".join(parts)


def _clip(text: str, limit: int, *, keep: str, truncated: bool) -> str:
    text = clean_text(text, 10**9)
    if len(text) <= limit:
        return text + ("\n[output truncated]" if truncated else "")
    cut = len(text) - limit
    note = f"[output truncated: {cut}{'+' if truncated else ''} characters not shown]"
    return f"{text[:limit]}\n{note}" if keep == "head" else f"{note}\n{text[-limit:]}"


def _sandbox_config(
    spec: str | Mapping[str, Any], packages: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The sandbox spec (with default limits and package binds), its env and bound packages."""
    if isinstance(spec, str):
        spec = {"backend": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"sandbox must be a backend name or a mapping, got {spec!r}")
    if isinstance(packages, str):
        raise ValueError("sandbox_packages must be a list of package names")
    spec = dict(spec)
    spec.setdefault("limits", dict(DEFAULT_SANDBOX_LIMITS))
    env: dict[str, str] = {}
    bound: list[str] = []
    if spec.get("backend", "local") == "local" and packages:
        binds, roots = list(spec.get("extra_ro_binds", ())), []
        for name in packages:
            found = importlib.util.find_spec(str(name)) if str(name).isidentifier() else None
            if found is None:
                raise ValueError(f"sandbox_packages: package {name!r} is not installed here")
            path = (found.submodule_search_locations or [found.origin])[0]
            if path is None or not os.path.exists(path):
                raise ValueError(f"sandbox_packages: cannot locate the files of {name!r}")
            binds.append(os.path.realpath(path))
            root = os.path.dirname(os.path.realpath(path))
            roots += [root] if root not in roots else []
            bound.append(str(name))
        spec["extra_ro_binds"] = binds
        env["PYTHONPATH"] = os.pathsep.join(roots)
        if "workdir" not in spec and any(p == "/work" or p.startswith("/work/") for p in binds):
            spec["workdir"] = "/workspace"  # keep the package binds out of the agent's workdir
    make_sandbox(spec)  # validate backend, options and limits now (ValueError)
    return spec, env, bound


def _check_range(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        low <= value <= high
    ):
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")
