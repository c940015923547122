"""``sao_gym/CoqProof-v0``: prove a Coq theorem, repairing the proof with Coq's messages.

The agent sees a theorem with its context (imports, definitions) and has two
tools:

- ``check_proof(script)``: runs ``coqc`` (in the episode's sandbox) on the
  context, the theorem and the script; answers with Coq's verdict: errors with
  the line in the script and the goals before the failing sentence, the goals
  left when the proof is unfinished, the axioms it relies on. Does not end the
  episode.
- ``submit_proof(script)``: the same check, then the episode ends with reward
  1 only if ``coqc`` accepts the file and ``Print Assumptions`` reports no
  axioms (see :mod:`sao_gym.envs.coq_proof.checker` for the file and the
  rules that keep the statement unchanged).

The script is what goes between ``Proof.`` and ``Qed.``: tactics only.
Tasks: the bundled theorems (:func:`~sao_gym.envs.coq_proof.tasks.bundled_tasks`),
a JSONL file, or a user's ``.v`` files whose ``Admitted`` proofs become tasks.

One sandbox per episode, from a :class:`~sao_gym.sandbox.SandboxPool` (the
``sandbox_pool`` argument, or :func:`~sao_gym.sandbox.shared_pool` of the
spec): leased at reset, so it starts while the model writes its first turn,
awaited at the first check, released (closed) at submission, the next reset
or ``close``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sao_gym.envs.coq_proof import checker as checker_module
from sao_gym.envs.coq_proof.checker import DOCKER_IMAGE, CoqChecker
from sao_gym.envs.coq_proof.tasks import CoqTask, bundled_tasks, load_jsonl, load_v_files
from sao_gym.sandbox import EpisodeSandbox, Sandbox, SandboxPool, make_sandbox
from sao_gym.tools import ToolEnv, ToolResult, tool
from sao_gym.types import Message

SYSTEM_PROMPT = (
    "You prove theorems in the Coq proof assistant (Coq 8.16). Write a proof script: the "
    "tactics that go between `Proof.` and `Qed.`, for example "
    "`intros n. induction n as [|n IH]; simpl; auto.` Only tactics are allowed (with bullets, "
    "braces, goal selectors and queries such as Show, Check or Search): no Admitted, admit, "
    "Axiom, Qed or other commands. Call check_proof(script) to run Coq on a script and read its "
    "errors and remaining goals; it does not end the episode. Call submit_proof(script) with "
    "your final script: it ends the episode, with reward 1 if Coq accepts the proof and the "
    "theorem depends on no axioms."
)
_SCRIPT_SCHEMA = {
    "type": "object",
    "properties": {
        "script": {
            "type": "string",
            "description": "The proof script (tactics between Proof. and Qed.), e.g. "
                           "'intros n. induction n; simpl; auto.'",
        }
    },
    "required": ["script"],
    "additionalProperties": False,
}


class CoqProofEnv(ToolEnv):
    """Coq theorem proving with ``check_proof`` and ``submit_proof`` tools.

    Args:
        tasks: None for the bundled theorems; a ``.jsonl`` file of task
            records; a ``.v`` file or a directory of them (each ``Admitted``
            proof becomes a task); or a list of :class:`CoqTask` or dicts.
        difficulty: keep only tasks of this difficulty (an int or several).
        topics: keep only tasks of these topics (e.g. ``["logic", "list"]``).
        sandbox: where ``coqc`` runs: anything
            :func:`sao_gym.sandbox.make_sandbox` accepts (default ``"local"``).
            One sandbox per episode, leased at reset from the shared pool of
            this spec (its ``"pool"`` entry: :data:`~sao_gym.sandbox.POOL_OPTIONS`).
            A Docker sandbox without an ``image`` uses ``sao-gym-sandbox-coq:latest``
            (see docs/envs/coq_proof.md for how to build it).
        sandbox_pool: take sandboxes from this pool instead (the caller owns it).
        timeout_s: wall-clock limit of one ``coqc`` run.
        goals_on_error: on a tactic error, ``check_proof`` also shows the goals
            before the failing sentence (a second ``coqc`` run).
        max_message_chars: tool answers are cut to this size.
        max_context_chars: contexts longer than this are shown to the model
            by their last characters only (Coq always checks the whole).

    """

    def __init__(
        self,
        *,
        tasks: str | os.PathLike[str] | Iterable[CoqTask | Mapping[str, Any]] | None = None,
        difficulty: int | Iterable[int] | None = None,
        topics: Iterable[str] | None = None,
        sandbox: str | Mapping[str, Any] = "local",
        sandbox_pool: SandboxPool | None = None,
        timeout_s: float = 30.0,
        goals_on_error: bool = True,
        max_message_chars: int = 6000,
        max_context_chars: int = 12000,
    ):
        super().__init__()
        if isinstance(sandbox, Sandbox) or not isinstance(sandbox, (str, Mapping)):
            raise ValueError("sandbox must be a make_sandbox spec (a backend name or a mapping); "
                             "the env starts one sandbox per episode")
        sandbox = _with_coq_image(sandbox)
        make_sandbox(sandbox)  # validates the spec now (unstarted, nothing to close)
        CoqChecker(sandbox, timeout_s=timeout_s, max_message_chars=max_message_chars)
        if max_context_chars < 100:
            raise ValueError(f"max_context_chars must be >= 100, got {max_context_chars}")
        self.tasks = _select(_load(tasks), difficulty, topics)
        self._by_id = {t.id: t for t in self.tasks}
        self.sandbox_spec = sandbox
        self.timeout_s = float(timeout_s)
        self.goals_on_error = goals_on_error
        self.max_message_chars = max_message_chars
        self.max_context_chars = max_context_chars
        self._box = EpisodeSandbox(sandbox_pool, owner=self)
        self._checker: CoqChecker | None = None
        self._task: CoqTask | None = None
        self.task: dict[str, Any] | None = None

    # ----- episode ------------------------------------------------------------------
    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a task (``options["task"]``: an id, an index, a record; else by seed)."""
        await self._end_episode()
        if "task" in options:
            task = self._task_from(options["task"])
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._task = task
        prompt = self._prompt(task)
        self.task = {**task.to_dict(), "prompt": prompt}
        # built as CoqChecker builds its own sandbox (checker.make_sandbox, read now)
        await self._box.lease(self.sandbox_spec, make=checker_module.make_sandbox)
        obs: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt},
        ]
        return obs, {"task_id": task.id, "difficulty": task.difficulty}

    async def on_close(self) -> None:
        """Release (close) the episode's sandbox."""
        await self._end_episode()

    async def _end_episode(self) -> None:
        self._checker = None  # its sandbox is the lease's: the pool closes it
        await self._box.release()

    async def _ready_checker(self) -> CoqChecker:
        """The episode's checker, on its sandbox (awaited here: a failed start raises)."""
        if self._checker is None:
            self._checker = CoqChecker(await self._box.get(), timeout_s=self.timeout_s,
                                       goals_on_error=self.goals_on_error,
                                       max_message_chars=self.max_message_chars)
        return self._checker

    def _task_from(self, spec: Any) -> CoqTask:
        if isinstance(spec, CoqTask):
            return spec
        if isinstance(spec, str):
            if spec not in self._by_id:
                raise ValueError(f"unknown task id {spec!r} ({len(self.tasks)} tasks loaded)")
            return self._by_id[spec]
        if isinstance(spec, int) and not isinstance(spec, bool):
            if not 0 <= spec < len(self.tasks):
                raise ValueError(f"task index {spec} out of range [0, {len(self.tasks)})")
            return self.tasks[spec]
        if isinstance(spec, Mapping):
            return CoqTask.from_dict(spec)
        raise ValueError('options["task"] must be a task id, an index, a CoqTask or a mapping '
                         'with a "statement"')

    def _prompt(self, task: CoqTask) -> str:
        parts = ["Prove the following Coq theorem."]
        context = task.context.strip()
        if context:
            if len(context) > self.max_context_chars:
                omitted = len(context) - self.max_context_chars
                context = (f"(* ... {omitted} earlier characters of the context omitted *)\n"
                           + context[-self.max_context_chars:])
            parts.append(f"Context (already loaded before the theorem):\n```coq\n{context}\n```")
        parts.append(f"Theorem:\n```coq\n{task.statement}\n```")
        parts.append("Reply with tool calls: check_proof(script) to test a proof script, "
                     "submit_proof(script) to submit it.")
        return "\n\n".join(parts)

    # ----- tools --------------------------------------------------------------------
    @tool(
        description="Run Coq on a proof script without ending the episode. Returns Coq's "
                    "messages: errors with their line in the script and the goals there, the "
                    "goals left if the proof is unfinished, or that the proof is complete.",
        parameters=_SCRIPT_SCHEMA,
    )
    async def check_proof(self, script: str) -> ToolResult:
        """Check a script; the episode goes on."""
        assert self._task is not None
        result = await (await self._ready_checker()).check(self._task, script)
        text = result.message
        if result.proved:
            text += " Call submit_proof with this script to finish."
        return ToolResult(text, info={"coq_status": result.status,
                                      "metrics": {"coq_seconds": result.coq_seconds}})

    @tool(
        description="Submit the final proof script. Ends the episode: reward 1 if Coq accepts "
                    "the proof and the theorem depends on no axioms, else 0.",
        parameters=_SCRIPT_SCHEMA,
    )
    async def submit_proof(self, script: str) -> ToolResult:
        """Check a script and end the episode."""
        assert self._task is not None
        try:
            checker = await self._ready_checker()
            result = await checker.check(self._task, script, show_goals=False)
        finally:
            await self._end_episode()
        text = ("Proof accepted: Coq checked it and the theorem depends on no axioms."
                if result.proved else f"Proof rejected. {result.message}")
        return ToolResult(
            text,
            terminated=True,
            reward=1.0 if result.proved else 0.0,
            info={"coq_status": result.status,
                  "reward_components": {"proved": float(result.proved)},
                  "metrics": {"coq_seconds": result.coq_seconds}},
        )


def _with_coq_image(spec: str | Mapping[str, Any]) -> str | Mapping[str, Any]:
    """A Docker spec without an image gets the Coq image (the default image has no Coq)."""
    options = {"backend": spec} if isinstance(spec, str) else dict(spec)
    if options.get("backend") == "docker" and "image" not in options:
        return {**options, "image": DOCKER_IMAGE}
    return spec


def _load(tasks: Any) -> list[CoqTask]:
    if tasks is None:
        return bundled_tasks()
    if isinstance(tasks, (str, os.PathLike)):
        path = Path(tasks)
        if path.suffix == ".jsonl":
            if not path.is_file():
                raise ValueError(f"no such task file: {path}")
            return load_jsonl(path, source=str(path))
        return load_v_files(path)
    if isinstance(tasks, Mapping):
        raise ValueError("tasks must be a list of tasks, a path or None, not a single mapping")
    try:
        items = list(tasks)
    except TypeError:
        raise ValueError(f"tasks must be None, a path or a list, got {type(tasks).__name__}") \
            from None
    loaded = [t if isinstance(t, CoqTask) else CoqTask.from_dict(t) for t in items]
    if len({t.id for t in loaded}) != len(loaded):
        raise ValueError("task ids must be unique")
    return loaded


def _select(tasks: list[CoqTask], difficulty: Any, topics: Any) -> list[CoqTask]:
    if difficulty is not None:
        wanted = {difficulty} if isinstance(difficulty, int) else set(difficulty)
        if not wanted <= {1, 2, 3}:
            raise ValueError(f"difficulty must be among 1, 2, 3, got {sorted(wanted, key=str)}")
        tasks = [t for t in tasks if t.difficulty in wanted]
    if topics is not None:
        if isinstance(topics, str):
            topics = [topics]
        wanted_topics = set(topics)
        tasks = [t for t in tasks if t.topic in wanted_topics]
    if not tasks:
        raise ValueError("no Coq task left to choose from (check tasks, difficulty and topics)")
    return tasks
