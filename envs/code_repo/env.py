"""``sao_gym/CodeRepo-v0``: repair a repository, graded by hidden tests (SWE-bench style).

At reset the task's repository is written into a fresh sandbox (the working
directory, ``/work`` by default) and committed to git, so ``git diff`` shows
the agent's changes. The agent sees the problem statement and works with six
tools: ``bash(command)``, ``read_file(path)``, ``write_file(path, content)``,
``str_replace(path, old, new)``, ``run_tests()`` (the repository's test files
as they are now) and ``submit()``. ``submit`` removes the test directories,
writes the hidden test files fresh (whatever the agent did to its copies),
runs them and ends the episode.

Reward: 1 when every ``FAIL_TO_PASS`` test passes and every ``PASS_TO_PASS``
test still passes, else 0; with ``partial_credit=True``, the product of the
two pass fractions. ``info["reward_components"]`` always carries
``resolved``, ``fail_to_pass`` and ``pass_to_pass``.

Long horizon: the registered turn limit is 50 (``max_episode_steps``); the
conversation's size is bounded by ``max_context_tokens`` (estimated at 4
bytes per token, like :class:`~sao_gym.wrappers.TokenBudget`): the step that
crosses it is truncated with ``stop_reason`` ``max_tokens``.

The sandbox comes from a :class:`~sao_gym.sandbox.SandboxPool` (the
``sandbox_pool`` argument, or the pool shared by everything on the event loop
that uses the same spec: :func:`~sao_gym.sandbox.shared_pool`); reset leases
and awaits it (the repository is written at once), the next reset or
``close`` releases it, closing it (one sandbox per episode).

Sandbox failures that are not the agent's doing (the sandbox cannot start,
crashes, an image is missing) propagate as :class:`SandboxError` and mark the
rollout as an infrastructure failure; the agent's own timeouts, crashes and
bad paths are tool messages.
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.envs.code_repo import grading
from sao_gym.envs.code_repo.sources import load_tasks, tasks_from_records
from sao_gym.envs.code_repo.tasks import RepoTask, patched_paths
from sao_gym.sandbox import (
    EpisodeSandbox,
    SandboxError,
    SandboxPool,
    SandboxUnavailable,
    make_sandbox,
)
from sao_gym.sandbox.base import ExecResult, Sandbox, resolve_in_workdir
from sao_gym.tools import ToolEnv, ToolError, ToolResult, tool
from sao_gym.types import Message, StopReason
from sao_gym.wrappers import approx_token_count, message_text

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a software engineer working in a git repository inside a sandbox; the current "
    "directory ({workdir}) is the repository root. Tools: `bash` runs a shell command "
    "(each call is a fresh shell: use `cd dir && ...`; no network); `read_file`, "
    "`write_file` and `str_replace` read and edit files (paths relative to the repository "
    "root); `run_tests` runs the repository's tests; `submit` ends the episode and grades "
    "your work with hidden tests. Make the smallest change that solves the task, check it, "
    "then call `submit`."
)
GIT_ENV = {
    "HOME": "/tmp", "GIT_AUTHOR_NAME": "sao-gym", "GIT_AUTHOR_EMAIL": "sao-gym@sandbox",
    "GIT_COMMITTER_NAME": "sao-gym", "GIT_COMMITTER_EMAIL": "sao-gym@sandbox",
    "GIT_CONFIG_NOSYSTEM": "1", "PYTHONDONTWRITEBYTECODE": "1",
}
"""Environment of every command: git identity, HOME outside the repository."""


class CodeRepoEnv(ToolEnv):
    """Repository repair with hidden tests (see the module docs).

    Args:
        tasks: ``"all"`` (HumanEval and the shipped bug-injection tasks),
            ``"humaneval"``, ``"bugs"``, a path to a ``.jsonl``/``.jsonl.gz``
            file (bug tasks from ``sao-gym tasks make-code-repo`` or SWE-bench
            style instances), or a list of records / :class:`RepoTask`.
        sandbox: anything :func:`~sao_gym.sandbox.make_sandbox` accepts (a
            ``"pool"`` entry configures the shared pool: :data:`~sao_gym.sandbox.POOL_OPTIONS`).
        sandbox_pool: take sandboxes from this pool (the caller owns it; the
            per-task Docker image of SWE instances then does not apply)
            instead of the shared pool of ``sandbox``.
        partial_credit: reward the product of the FAIL_TO_PASS and
            PASS_TO_PASS pass fractions instead of 0 when unresolved.
        max_context_tokens: truncate the episode once the conversation is
            estimated to exceed this many tokens (``None``: no budget).
        command_timeout_s: time limit of one ``bash`` call.
        test_timeout_s: time limit of one ``run_tests`` or grading run.
        test_timeout_per_test_s: time limit of one test (stdlib runner).
        max_output_chars: tool output longer than this is cut (head and tail kept).
        max_file_bytes: largest file ``write_file``/``str_replace`` may write.

    """

    max_tool_calls_per_turn = 8

    def __init__(
        self,
        *,
        tasks: str | Sequence[Any] = "all",
        sandbox: str | Mapping[str, Any] = "local",
        sandbox_pool: SandboxPool | None = None,
        partial_credit: bool = False,
        max_context_tokens: int | None = 32_768,
        command_timeout_s: float = 30.0,
        test_timeout_s: float = 120.0,
        test_timeout_per_test_s: float = 10.0,
        max_output_chars: int = 8000,
        max_file_bytes: int = 256 * 1024,
    ):
        super().__init__()
        if not isinstance(sandbox, (str, Mapping)):
            raise ValueError(f"sandbox must be a backend name or a mapping, got {sandbox!r}")
        make_sandbox(sandbox)  # fail early on a bad spec (builds, does not start)
        for name, value in (("command_timeout_s", command_timeout_s),
                            ("test_timeout_s", test_timeout_s),
                            ("test_timeout_per_test_s", test_timeout_per_test_s)):
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds, got {value!r}")
        if max_context_tokens is not None and (
                not isinstance(max_context_tokens, int) or max_context_tokens < 256):
            raise ValueError(f"max_context_tokens must be an int >= 256 or None, "
                             f"got {max_context_tokens!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 500:
            raise ValueError(f"max_output_chars must be an int >= 500, got {max_output_chars!r}")
        if not isinstance(max_file_bytes, int) or max_file_bytes < 1024:
            raise ValueError(f"max_file_bytes must be an int >= 1024, got {max_file_bytes!r}")
        self.tasks: list[RepoTask] = (load_tasks(tasks) if isinstance(tasks, str)
                                      else tasks_from_records(list(tasks)))
        if not self.tasks:
            raise ValueError("no tasks")
        self._by_id = {t.id: t for t in self.tasks}
        self.sandbox_spec = sandbox
        self.partial_credit = bool(partial_credit)
        self.max_context_tokens = max_context_tokens
        self.command_timeout_s = float(command_timeout_s)
        self.test_timeout_s = float(test_timeout_s)
        self.test_timeout_per_test_s = float(test_timeout_per_test_s)
        self.max_output_chars = max_output_chars
        self.max_file_bytes = max_file_bytes
        self.task: dict[str, Any] | None = None
        self.repo_task: RepoTask | None = None
        self._box = EpisodeSandbox(sandbox_pool, owner=self)
        self._tokens = 0
        self.timings: dict[str, deque[float]] = {}
        """Env-side seconds of the last 1000 calls of each tool, by name (for benchmarks)."""

    # ----- episode life cycle -----
    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a task, build its repository in a fresh sandbox (the last one is released)."""
        task = self._pick(options)
        self.repo_task, self.task = task, task.public()
        await self._box.lease(self._sandbox_spec(task))
        sandbox = await self._box.get()
        await self._populate(task)
        obs: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=sandbox.workdir)},
            {"role": "user", "content": task.prompt},
        ]
        self._tokens = sum(approx_token_count(message_text(m)) for m in obs)
        return obs, {"task_id": task.id, "source": task.source}

    def _pick(self, options: dict[str, Any]) -> RepoTask:
        if "task" not in options:
            return self.tasks[int(self.np_random.integers(0, len(self.tasks)))]
        choice = options["task"]
        if isinstance(choice, RepoTask):
            return choice
        if isinstance(choice, bool):
            raise ValueError('options["task"] must be a task id, an index or a task record')
        if isinstance(choice, int):
            if not 0 <= choice < len(self.tasks):
                raise ValueError(f"task index {choice} out of range [0, {len(self.tasks)})")
            return self.tasks[choice]
        if isinstance(choice, str):
            if choice not in self._by_id:
                raise ValueError(f"unknown task id {choice!r}")
            return self._by_id[choice]
        if isinstance(choice, dict):
            if choice.get("kind") == "package":
                raise ValueError("a bug task needs its package record: pass tasks=[...]")
            return tasks_from_records([choice], 'options["task"]')[0]
        raise ValueError('options["task"] must be a task id, an index or a task record')

    def _sandbox_spec(self, task: RepoTask) -> str | Mapping[str, Any]:
        """The env's spec; with Docker, a SWE instance's own image (its own pool, not warm)."""
        spec = self.sandbox_spec
        backend = spec if isinstance(spec, str) else str(spec.get("backend", "local"))
        if task.swe is not None and backend == "docker" and task.swe.image:
            options = {"backend": "docker"} if isinstance(spec, str) else dict(spec)
            if isinstance(options.get("pool"), Mapping):  # no warm containers per image
                options["pool"] = {**options["pool"], "size": 0}
            spec = {**options, "image": task.swe.image}
        return spec

    @property
    def _sandbox(self) -> Sandbox | None:
        """The episode's started sandbox (``None`` outside an episode)."""
        return self._box.sandbox

    async def _populate(self, task: RepoTask) -> None:
        sb = self._require_sandbox()
        if task.swe is None:
            for path, text in task.files.items():
                await sb.write_file(path, text)
            init = ("git -c init.defaultBranch=main init -q && git add -A && "
                    "git commit -q --no-gpg-sign -m 'initial commit'")
            await self._must(sb, init, "could not create the task's git repository")
            return
        swe = task.swe
        if swe.host_repo:
            await sb.upload(swe.host_repo, ".")
        elif swe.repo_dir:
            copy = f"cp -a {shlex.quote(swe.repo_dir.rstrip('/'))}/. ."
            result = await sb.run(["bash", "-c", copy], timeout_s=600, env=GIT_ENV)
            if not result.ok:
                raise SandboxUnavailable(
                    f"task {task.id}: cannot copy the repository from {swe.repo_dir} "
                    f"(is the sandbox running the task's image {swe.image}?): "
                    f"{result.stderr.strip()[-500:]}")
        base = shlex.quote(swe.base_commit)
        await self._must(sb, f"[ \"$(git rev-parse HEAD)\" = {base} ] || "
                             f"git checkout -q -f {base}",
                         f"task {task.id}: cannot check out base commit {swe.base_commit}")

    async def _must(self, sb: Sandbox, cmd: str, what: str) -> ExecResult:
        result = await sb.run(["bash", "-c", cmd], timeout_s=120, env=GIT_ENV)
        if not result.ok:
            raise SandboxError(f"{what}: exit {result.exit_code}: {result.stderr.strip()[-500:]}")
        return result

    def _require_sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise SandboxError("the episode's sandbox is gone (the env was closed)")
        return self._sandbox

    async def on_close(self) -> None:
        """Release (close) the episode's sandbox."""
        await self._box.release()

    async def on_step(self, action: Message):
        """Run the tool calls, time them, apply the context budget."""
        start = time.perf_counter()
        obs, reward, terminated, truncated, info = await super().on_step(action)
        calls = action.get("tool_calls") or []
        if len(calls) == 1 and isinstance(calls[0], dict):
            name = str((calls[0].get("function") or {}).get("name", ""))[:64]
            if name in self.tool_specs():
                self.timings.setdefault(name, deque(maxlen=1000)).append(
                    time.perf_counter() - start)
        if self.max_context_tokens is not None:
            self._tokens += approx_token_count(message_text(action))
            self._tokens += sum(approx_token_count(message_text(m)) for m in obs)
            info.setdefault("metrics", {})["context_tokens"] = float(self._tokens)
            if not terminated and self._tokens > self.max_context_tokens:
                obs = [*obs, {"role": "user", "content": (
                    f"The conversation exceeded its budget of {self.max_context_tokens} tokens: "
                    "the episode is over.")}]
                truncated = True
                info["stop_reason"] = StopReason.MAX_TOKENS
        return obs, reward, terminated, truncated, info

    # ----- helpers -----
    def _cut(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
        return (f"{head}\n... [{len(text) - len(head) - len(tail)} characters cut] ...\n{tail}")

    def _path(self, path: str) -> str:
        sb = self._require_sandbox()
        if not path or not path.strip():
            raise ToolError("path is empty")
        try:
            return resolve_in_workdir(sb.workdir, path)
        except ValueError as e:
            raise ToolError(f"{e}; paths must stay inside the repository") from None

    async def _file_error(self, path: str, e: OSError) -> ToolError:
        """An agent-facing error for a failed file operation (after checking the sandbox)."""
        await self._require_sandbox().run(["true"], timeout_s=30)  # raises if the sandbox died
        reason = {2: "no such file", 21: "is a directory", 20: "a parent is not a directory",
                  40: "refusing to follow a symlink", 27: "file too large",
                  28: "no space left in the sandbox"}.get(e.errno or 0, e.strerror or str(e))
        if "symlink" in str(e):
            reason = "refusing to follow a symlink inside the sandbox"
        return ToolError(f"{path}: {reason}")

    def _env(self) -> dict[str, str]:
        return dict(GIT_ENV)

    # ----- tools -----
    @tool(
        description="Run a shell command (bash) in the repository root and return its exit "
                    "code and output. Each call starts a fresh shell; no network.",
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "e.g. grep -rn foo src"}},
            "required": ["command"],
            "additionalProperties": False,
        },
    )
    async def bash(self, command: str) -> str:
        """Run a command in the sandbox."""
        if not command.strip():
            raise ToolError("command is empty")
        if len(command) > 100_000:
            raise ToolError(f"command is {len(command)} characters long; the limit is 100000 "
                            "(write long scripts with write_file)")
        if "\x00" in command:
            raise ToolError("command contains a NUL byte")
        sb = self._require_sandbox()
        result = await sb.run(["bash", "-c", command], timeout_s=self.command_timeout_s,
                              env=self._env(), max_output_bytes=256 * 1024)
        out = result.stdout
        if result.stderr:
            out += ("\n" if out and not out.endswith("\n") else "") + result.stderr
        status = f"exit code {result.exit_code}"
        if result.timed_out:
            status = (f"Error: the command timed out after {self.command_timeout_s:g} s "
                      "and was killed")
        elif result.oom_killed:
            status += " (out of memory)"
        if result.output_truncated:
            status += " (output truncated)"
        return self._cut(f"{status}\n{out}" if out else status)

    @tool(
        description="Read a text file of the repository (path relative to the repository root).",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "e.g. src/pkg/module.py"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    )
    async def read_file(self, path: str) -> str:
        """Return a file's text (long files are cut; use bash with sed -n for ranges)."""
        full = self._path(path)
        try:
            data = await self._require_sandbox().read_file(full)
        except OSError as e:
            raise await self._file_error(path, e) from None
        text = data.decode("utf-8", "replace")
        if len(text) > self.max_output_chars:
            lines = text.count("\n") + 1
            return (self._cut(text) + f"\n[the file has {lines} lines; read parts with "
                    "bash, e.g. sed -n '100,200p' FILE]")
        return text if text else "(empty file)"

    @tool(
        description="Create or overwrite a text file (path relative to the repository root).",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "e.g. src/pkg/module.py"},
                "content": {"type": "string", "description": "the whole new text of the file"},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    )
    async def write_file(self, path: str, content: str) -> str:
        """Write a file (parents created)."""
        full = self._path(path)
        data = content.encode("utf-8", "replace")
        if len(data) > self.max_file_bytes:
            raise ToolError(f"content is {len(data)} bytes; files are limited to "
                            f"{self.max_file_bytes} bytes")
        try:
            await self._require_sandbox().write_file(full, data)
        except OSError as e:
            raise await self._file_error(path, e) from None
        return f"Wrote {len(data)} bytes to {path}."

    @tool(
        description="Replace the one occurrence of `old` in a file with `new`. Fails when "
                    "`old` is missing or occurs more than once (add surrounding lines).",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "e.g. src/pkg/module.py"},
                "old": {"type": "string", "description": "the exact text to replace"},
                "new": {"type": "string", "description": "the text to put in its place"},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
    )
    async def str_replace(self, path: str, old: str, new: str) -> str:
        """Replace a unique snippet of a file."""
        full = self._path(path)
        if not old:
            raise ToolError("`old` is empty")
        sb = self._require_sandbox()
        try:
            text = (await sb.read_file(full)).decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text") from None
        except OSError as e:
            raise await self._file_error(path, e) from None
        count = text.count(old)
        if count == 0:
            raise ToolError(f"`old` was not found in {path} (it must match exactly, "
                            "whitespace included)")
        if count > 1:
            raise ToolError(f"`old` occurs {count} times in {path}; include more lines so "
                            "that it is unique")
        data = text.replace(old, new, 1).encode("utf-8", "replace")
        if len(data) > self.max_file_bytes:
            raise ToolError(f"the result would be {len(data)} bytes; files are limited to "
                            f"{self.max_file_bytes} bytes")
        try:
            await sb.write_file(full, data)
        except OSError as e:
            raise await self._file_error(path, e) from None
        line = text[: text.index(old)].count("\n") + 1
        return f"Replaced 1 occurrence in {path} (at line {line})."

    @tool(
        description="Run the repository's tests (the test files as they are now) and "
                    "report passes and failures.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )
    async def run_tests(self) -> str:
        """Run the visible tests."""
        task = self._current()
        sb = self._require_sandbox()
        if task.runner == "pytest":
            targets = await self._existing(task.metadata.get("test_files") or task.test_dirs)
            if not targets:
                return "None of the task's test files exist in the repository."
            run = await grading.run_pytest(
                sb, sb.workdir, targets, test_cmd=task.swe.test_cmd if task.swe else None,
                timeout_s=self.test_timeout_s, env=self._env())
        else:
            run = await grading.run_builtin(
                sb, sb.workdir, [], discover=task.test_dirs, timeout_s=self.test_timeout_s,
                timeout_per_test=self.test_timeout_per_test_s, env=self._env())
            if not run.outcomes and not run.collect_errors and not run.timed_out:
                dirs = ", ".join(f"{d}/" for d in task.test_dirs)
                return (f"No test files (test_*.py) found under {dirs}. You can write your "
                        "own tests there.")
        return self._cut(run.summary(limit=self.max_output_chars))

    @tool(
        description="Submit your changes: hidden tests grade the repository and the "
                    "episode ends.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )
    async def submit(self) -> ToolResult:
        """Grade the working tree with the hidden tests and end the episode."""
        task = self._current()
        sb = self._require_sandbox()
        diff = await sb.run(["bash", "-c", "git add -A >/dev/null 2>&1; git diff --cached "
                             + (shlex.quote(task.swe.base_commit) if task.swe else "HEAD")],
                            timeout_s=60, env=self._env(), max_output_bytes=1 << 20)
        run, problem = await self.grade_sandbox(sb, task)
        grade = grading.score(run.outcomes, task.fail_to_pass, task.pass_to_pass,
                              partial_credit=self.partial_credit)
        lines = [f"Submitted. FAIL_TO_PASS: {grade.f2p_passed}/{grade.f2p_total} passing, "
                 f"PASS_TO_PASS: {grade.p2p_passed}/{grade.p2p_total} passing.",
                 "Resolved." if grade.resolved else "Not resolved."]
        if problem:
            lines.append(problem)
        info = {
            "reward_components": grade.components(),
            "metrics": {"fail_to_pass_passed": float(grade.f2p_passed),
                        "pass_to_pass_passed": float(grade.p2p_passed),
                        "grading_seconds": run.duration_s,
                        "patch_bytes": float(len(diff.stdout.encode()))},
            "model_patch": diff.stdout[:65536],
            "failing_tests": list(grade.failing),
        }
        return ToolResult("\n".join(lines), terminated=True, reward=grade.reward, info=info)

    async def _existing(self, paths: Sequence[str]) -> list[str]:
        """Those of ``paths`` that exist in the repository now."""
        quoted = " ".join(shlex.quote(p) for p in paths)
        result = await self._require_sandbox().run(
            ["bash", "-c", f"for p in {quoted}; do [ -e \"$p\" ] && echo \"$p\"; done"],
            timeout_s=30, env=self._env())
        return [line for line in result.stdout.splitlines() if line]

    def _current(self) -> RepoTask:
        if self.repo_task is None:
            raise SandboxError("no task: call reset() first")
        return self.repo_task

    async def grade_sandbox(self, sb: Sandbox, task: RepoTask,
                            root: str | None = None) -> tuple[grading.TestRun, str]:
        """Restore the hidden tests in ``sb`` and run them; returns the run and a note."""
        root = root or sb.workdir
        env = self._env()
        if task.swe is not None:
            return await self._grade_swe(sb, task, root, env)
        await prepare_hidden_tests(sb, task, root)
        conftests = [p for p in task.hidden_tests if posixpath.basename(p) == "conftest.py"]
        run = await grading.run_builtin(
            sb, root, task.grading_targets, timeout_s=self.test_timeout_s,
            timeout_per_test=self.test_timeout_per_test_s, conftest=conftests, env=env)
        note = "The test run hit its time limit." if run.timed_out else ""
        return run, note

    async def _grade_swe(self, sb: Sandbox, task: RepoTask, root: str,
                         env: dict[str, str]) -> tuple[grading.TestRun, str]:
        swe = task.swe
        assert swe is not None
        base = shlex.quote(swe.base_commit)
        for path in patched_paths(swe.test_patch):
            q = shlex.quote(path)
            await sb.run(["bash", "-c", f"if git cat-file -e {base}:{q} 2>/dev/null; then "
                          f"git checkout -q {base} -- {q}; else rm -rf -- {q}; fi"],
                         timeout_s=60, cwd=root, env=env)
        applied = await sb.run(["git", "apply", "--whitespace=nowarn", "-"],
                               stdin=swe.test_patch, timeout_s=60, cwd=root, env=env)
        if not applied.ok:
            return grading.TestRun({}), (f"The hidden tests could not be applied: "
                                         f"{applied.stderr.strip()[-500:]}")
        ids = [*task.fail_to_pass, *task.pass_to_pass]
        if task.runner == "pytest":
            run = await grading.run_pytest(sb, root, ids, test_cmd=swe.test_cmd,
                                           timeout_s=self.test_timeout_s, env=env)
        else:
            run = await grading.run_builtin(
                sb, root, task.grading_targets, select=ids, timeout_s=self.test_timeout_s,
                timeout_per_test=self.test_timeout_per_test_s, conftest=True, env=env)
        return run, ("The test run hit its time limit." if run.timed_out else "")


def test_dirs_to_clear(task: RepoTask) -> list[str]:
    """Top-level directories holding hidden tests: removed before the tests are rewritten."""
    return sorted({p.split("/", 1)[0] for p in task.hidden_tests if "/" in p})


async def prepare_hidden_tests(sb: Sandbox, task: RepoTask, root: str) -> None:
    """Remove the test directories under ``root`` and write the hidden test files fresh."""
    dirs = test_dirs_to_clear(task)
    if dirs:
        quoted = " ".join(shlex.quote(d) for d in dirs)
        rm = f"chmod -R u+rwX -- {quoted} 2>/dev/null; rm -rf -- {quoted}"
        result = await sb.run(["bash", "-c", rm], timeout_s=60, cwd=root, env=GIT_ENV)
        if not result.ok:
            # e.g. the agent made a directory unwritable; the files are still rewritten
            logger.info("could not clear test dirs: %s", result.stderr.strip()[-300:])
    rel_root = posixpath.relpath(root, sb.workdir)
    for path, text in task.hidden_tests.items():
        target = path if rel_root == "." else posixpath.join(rel_root, path)
        try:
            await sb.write_file(target, text)
        except OSError:
            # a symlink or unwritable file planted by the agent: replace it
            await sb.run(["rm", "-rf", "--", target], timeout_s=30, env=GIT_ENV)
            await sb.write_file(target, text)
