"""Run any Harbor task directory as a tool-calling environment (registered by ``sao_gym.envs``).

At reset the task's container starts as a :class:`~sao_gym.sandbox.docker.DockerSandbox`
(built offline from ``environment/Dockerfile``; see :mod:`sao_gym.adapters.harbor.docker`),
``instruction.md`` is the user message, and the agent has two tools:

- ``bash(command)``: a shell command in the task's working directory (each
  call a fresh shell; no network, whatever ``task.toml`` says);
- ``submit()``: ends the episode and grades it.

Grading is Harbor's verifier: ``tests/`` is copied to ``/tests``,
``/tests/test.sh`` runs from the working directory with its output in
``/logs/verifier/test-stdout.txt``, and the reward is ``reward.json``'s
``reward`` (or its only value) or else the number in ``reward.txt``. With
``[verifier].environment_mode = "separate"`` (what Harbor's linter asks for,
and what exported tasks use) it runs in a fresh container of the verifier's
image (``tests/Dockerfile``, else the task image) into which the task's
``artifacts`` and ``/logs/artifacts`` are copied from the agent's container.
The episode is also graded when it reaches its turn limit (``max_turns``, by
default the registered ``max_episode_steps``); it then ends truncated.

A missing or garbled reward file gives reward 0 and says so; a verifier that
runs past ``[verifier].timeout_sec`` gives 0. Failures of the machinery (the
image cannot be built, a container dies, files cannot be copied) raise
:class:`~sao_gym.sandbox.SandboxError` at reset and in ``bash`` (an infra
failure of the rollout) and give reward 0 with ``info["infra_failure"]`` at
grading.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import posixpath
import secrets
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sao_gym.adapters.harbor import docker as hd
from sao_gym.adapters.harbor.task import REWARD_JSON, REWARD_TXT, HarborTask, find_tasks, load_task
from sao_gym.core import clean_text
from sao_gym.sandbox import EpisodeSandbox, SandboxError, make_sandbox
from sao_gym.sandbox.base import Sandbox
from sao_gym.tools import ToolEnv, ToolError, ToolResult, tool
from sao_gym.types import Message, StopReason

SYSTEM_PROMPT = (
    "You are an agent working in a Linux container; the current directory is {workdir}. "
    "Use the `bash` tool to run shell commands (each call is a fresh shell; there is no "
    "network). When the task is done, call `submit`: the task's tests then grade your work "
    "and the episode ends."
)
_STDOUT = "/logs/verifier/test-stdout.txt"


class HarborTaskEnv(ToolEnv):
    """A Harbor task directory as an environment (see the module docs).

    Args:
        task_dir: one task directory (with ``task.toml``).
        tasks_dir: a directory of task directories; reset picks one by seed,
            or ``options={"task": NAME_OR_INDEX}``.
        sandbox: ``DockerSandbox`` options: ``user`` (default ``65534:65534``;
            ``"0:0"`` for tasks that need root), ``limits`` (overrides the
            task's ``cpus``/``memory_mb``/``storage_mb``) and a ``pool`` entry.
        oracle: copy ``solution/`` to ``/solution`` at reset (as Harbor's
            oracle agent does), for checking a task; never for a model.
        command_timeout_s: time limit of one ``bash`` call.
        max_turns: grade and end the episode after this many turns (default:
            the registration's ``max_episode_steps``; ``None`` there: no limit).
        max_output_chars: tool output longer than this is cut (head and tail kept).
        build_timeout_s: limit on building a task's image.

    """

    def __init__(self, *, task_dir: str | Path | None = None,
                 tasks_dir: str | Path | None = None,
                 sandbox: Mapping[str, Any] | None = None, oracle: bool = False,
                 command_timeout_s: float = 60.0, max_turns: int | None = None,
                 max_output_chars: int = 8000, build_timeout_s: float = 600.0):
        super().__init__()
        if (task_dir is None) == (tasks_dir is None):
            raise ValueError("give exactly one of task_dir (one task) and tasks_dir "
                             "(a directory of tasks)")
        paths = [Path(task_dir)] if task_dir is not None else find_tasks(tasks_dir)
        self.tasks = [load_task(p) for p in paths]
        self._by_name = {t.path.name: t for t in self.tasks} | {t.name: t for t in self.tasks}
        options = dict(sandbox or {})
        unknown = set(options) - {"user", "limits", "pool"}
        if unknown:
            raise ValueError(f"unknown sandbox options {sorted(unknown)}; valid: limits, "
                             "pool, user (the backend is always docker)")
        make_sandbox({"backend": "docker", **options})  # validates the options now
        for name, value in (("command_timeout_s", command_timeout_s),
                            ("build_timeout_s", build_timeout_s)):
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds, got {value!r}")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be an int >= 1 or None, got {max_turns!r}")
        self.sandbox_options = options
        self.oracle = bool(oracle)
        self.command_timeout_s = float(command_timeout_s)
        self.max_turns = max_turns
        self.max_output_chars = max(500, int(max_output_chars))
        self.build_timeout_s = float(build_timeout_s)
        self.harbor_task: HarborTask | None = None
        self.task: dict[str, Any] | None = None
        self._images: dict[Path, tuple[hd.RunnerImage, hd.RunnerImage]] = {}
        self._box = EpisodeSandbox(owner=self)
        self._turns = 0
        self._shell = "sh"  # bash where the task's image has it, by its path (reset finds it)
        self._verifier_env: dict[str, str] = {}

    # ----- episode life cycle -----
    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a task, start its container (building its image first, once)."""
        await self._box.release()
        task = self._pick(options)
        self._verifier_env = task.resolved_verifier_env()  # a missing ${VAR} fails here
        self.harbor_task, self._turns = task, 0
        self.task = {"id": task.name, "task_dir": str(task.path), "instruction": task.instruction}
        agent_image, _ = await self._runner_images(task)
        await self._box.lease(self._spec(task, agent_image))
        sb = await self._box.get()
        await self._setup(sb, agent_image.workdir)
        if self.oracle and task.solution_dir.is_dir():
            await hd.unpack(sb, hd.tar_of(task.solution_dir), f"{hd.STATE}/solution", clear=True)
        probe = await sb.run("command -v bash", timeout_s=30)
        found = probe.stdout.strip()
        self._shell = found if probe.ok and found.startswith("/") else "sh"
        obs: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=agent_image.workdir)},
            {"role": "user", "content": task.instruction},
        ]
        return obs, {"task_id": task.name, "task_dir": str(task.path)}

    def _pick(self, options: dict[str, Any]) -> HarborTask:
        if "task" not in options:
            return self.tasks[int(self.np_random.integers(0, len(self.tasks)))]
        choice = options["task"]
        if isinstance(choice, int) and not isinstance(choice, bool):
            if not 0 <= choice < len(self.tasks):
                raise ValueError(f"task index {choice} out of range [0, {len(self.tasks)})")
            return self.tasks[choice]
        if isinstance(choice, str) and choice in self._by_name:
            return self._by_name[choice]
        raise ValueError(f'options["task"] must be a task name or an index; unknown {choice!r} '
                         f"(tasks: {', '.join(t.path.name for t in self.tasks[:10])}...)")

    async def _runner_images(self, task: HarborTask) -> tuple[hd.RunnerImage, hd.RunnerImage]:
        """(agent, verifier) runner images of ``task``, built in a thread the first time."""
        if task.path not in self._images:
            def build() -> tuple[hd.RunnerImage, hd.RunnerImage]:
                client = hd.docker_client()
                context = None if task.docker_image else task.environment_dir  # prebuilt first
                base = hd.build_task_image(task.name, context, task.docker_image,
                                           timeout_s=self.build_timeout_s, client=client)
                agent = hd.build_runner_image(task.name, base, task.workdir,
                                              timeout_s=self.build_timeout_s, client=client)
                if task.verifier_context is None:
                    return agent, agent
                tests = hd.build_task_image(f"{task.name}-verifier", task.verifier_context,
                                            None, timeout_s=self.build_timeout_s, client=client)
                return agent, hd.build_runner_image(f"{task.name}-verifier", tests, agent.workdir,
                                                    timeout_s=self.build_timeout_s, client=client)
            self._images[task.path] = await asyncio.to_thread(build)
        return self._images[task.path]

    def _spec(self, task: HarborTask, image: hd.RunnerImage) -> dict[str, Any]:
        limits = {"cpus": task.cpus or 1.0, "memory_mb": task.memory_mb or 2048,
                  "disk_mb": min(task.storage_mb or 1024, 4096), "cpu_seconds": 600}
        limits.update(self.sandbox_options.get("limits") or {})
        spec: dict[str, Any] = {"backend": "docker", "image": image.tag,
                                "workdir": image.workdir, "limits": limits,
                                "user": self.sandbox_options.get("user", "65534:65534")}
        if "pool" in self.sandbox_options:
            spec["pool"] = self.sandbox_options["pool"]
        return spec

    async def _setup(self, sb: Sandbox, workdir: str) -> None:
        result = await sb.run(["/bin/sh", "-c", hd.SETUP, "sh", workdir], timeout_s=300)
        if not result.ok:
            raise SandboxError(f"cannot prepare the task's container (exit {result.exit_code}): "
                               f"{result.stderr.strip()[-800:]}; a task whose files only root "
                               'can read needs sandbox={"user": "0:0"}')

    async def on_close(self) -> None:
        """Close the episode's container."""
        await self._box.release()

    async def on_step(self, action: Message):
        """Run the tool calls; grade and end the episode at the turn limit."""
        obs, reward, terminated, truncated, info = await super().on_step(action)
        self._turns += 1
        limit = self.max_turns or (self.spec.max_episode_steps if self.spec else None)
        if not terminated and limit is not None and self._turns >= limit:
            result = await self._grade()
            obs = [*obs, {"role": "user", "content": f"The turn limit ({limit}) is reached: "
                                                     f"the task was graded. {result.content}"}]
            reward += result.reward
            info.update(result.info, stop_reason=StopReason.MAX_TURNS)
            truncated = True
        return obs, reward, terminated, truncated, info

    # ----- tools -----
    @tool(description="Run a shell command in the task's container (working directory: the "
                      "task's) and return its exit code and output. Each call is a fresh shell; "
                      "no network.",
          parameters={"type": "object",
                      "properties": {"command": {"type": "string",
                                                 "description": "e.g. ls -la && cat README.md"}},
                      "required": ["command"], "additionalProperties": False})
    async def bash(self, command: str) -> str:
        """Run a command in the sandbox."""
        if not command.strip():
            raise ToolError("command is empty")
        if "\x00" in command or len(command) > 100_000:
            raise ToolError("command contains a NUL byte or is longer than 100000 characters")
        sb = self._box.sandbox
        if sb is None:
            raise SandboxError("the episode's container is gone (the env was closed)")
        result = await sb.run([self._shell, "-c", command], timeout_s=self.command_timeout_s,
                              max_output_bytes=256 * 1024)
        out = result.stdout + (("\n" if result.stdout and not result.stdout.endswith("\n")
                                else "") + result.stderr if result.stderr else "")
        status = (f"Error: the command timed out after {self.command_timeout_s:g} s and was "
                  "killed" if result.timed_out else f"exit code {result.exit_code}")
        if result.oom_killed:
            status += " (out of memory)"
        return self._cut(f"{status}\n{out}" if out else status)

    @tool(description="Submit your work: the task's tests grade it and the episode ends.",
          parameters={"type": "object", "properties": {}, "additionalProperties": False})
    async def submit(self) -> ToolResult:
        """Grade the container and end the episode."""
        return await self._grade()

    def _cut(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        head, tail = text[: limit * 2 // 3], text[-(limit // 3):]
        return f"{head}\n... [{len(text) - len(head) - len(tail)} characters cut] ...\n{tail}"

    # ----- grading -----
    async def _grade(self) -> ToolResult:
        task, sb = self.harbor_task, self._box.sandbox
        try:
            if task is None or sb is None:
                raise SandboxError("the episode's container is gone (the env was closed)")
            if task.separate_verifier:
                reward, note, info = await self._verify_separately(task, sb)
            else:
                reward, note, info = await self._verify(task, sb, upload_tests=True)
        except SandboxError as e:
            reward, note = 0.0, f"The grader could not run (infrastructure failure): {e}"
            info = {"infra_failure": True, "verifier_error": clean_text(str(e), 1000)}
        finally:
            await self._box.release()
        info["reward_components"] = {"reward": reward}
        output = str(info.get("verifier_output") or "").strip()
        tail = f"\nThe tests' output (end):\n{output[-1500:]}" if output else ""
        return ToolResult(f"Submitted. Reward {reward:g}. {note}".strip() + tail,
                          terminated=True, reward=reward, info=info)

    async def _verify_separately(self, task: HarborTask,
                                 agent_box: Sandbox) -> tuple[float, str, dict[str, Any]]:
        _, image = await self._runner_images(task)
        moved = []
        sources = [(f"{hd.STATE}/logs/artifacts", "/logs/artifacts", ())]
        sources += [(a.source, a.source, a.exclude) for a in task.artifacts]
        for source, target, exclude in sources:
            try:
                kind, data = await hd.pack(agent_box, source, exclude)
            except ValueError as e:
                return 0.0, f"The artifact could not be collected: {e}.", {"verifier_error": str(e)}
            if kind != "missing" and not (target == "/logs/artifacts" and _empty_tar(data)):
                moved.append((target, kind, data))
        verifier_box = make_sandbox(self._spec(task, image))
        try:
            await verifier_box.start()
            await self._setup(verifier_box, image.workdir)
            for target, kind, data in moved:
                writable = (target == image.workdir or target.startswith(image.workdir + "/")
                            or target.startswith(("/tmp/", "/logs/")))
                if not writable:
                    raise SandboxError(f"artifact {target} cannot be restored: a DockerSandbox "
                                       f"can write only under {image.workdir}, /tmp and /logs")
                dest = target if kind == "dir" else posixpath.dirname(target)
                await hd.unpack(verifier_box, data, dest.replace("/logs/", f"{hd.STATE}/logs/", 1)
                                if dest.startswith("/logs/") else dest, clear=kind == "dir")
            return await self._verify(task, verifier_box,
                                      upload_tests=task.verifier_context is None)
        finally:
            await verifier_box.aclose()

    async def _verify(self, task: HarborTask, sb: Sandbox,
                      upload_tests: bool) -> tuple[float, str, dict[str, Any]]:
        """Run ``/tests/test.sh`` in ``sb`` and read the reward (see the module docs)."""
        # A fresh /logs/verifier (and /tests): in shared mode the agent had the same uid
        # and could have planted a reward file in a directory it made read-only.
        fresh = " ".join(["logs/verifier", *(["tests"] if upload_tests else [])])
        reset = await sb.run(["/bin/sh", "-c", f"chmod -R u+rwX {hd.STATE} 2>/dev/null; "
                              f"cd {hd.STATE} && rm -rf {fresh} && mkdir -p {fresh}"],
                             timeout_s=60)
        if not reset.ok:
            raise SandboxError(f"cannot reset /logs/verifier: {reset.stderr.strip()[-500:]}")
        if upload_tests:
            await hd.unpack(sb, hd.tar_of(task.tests_dir), f"{hd.STATE}/tests")
        workdir = shlex.quote(sb.workdir)
        cmd = (f"chmod +x /tests/test.sh 2>/dev/null; "
               f"cd {workdir} && /tests/test.sh > {_STDOUT} 2>&1")
        timeout = min(task.verifier_timeout_s, 3600.0)
        run = await sb.run(["/bin/sh", "-c", cmd], timeout_s=timeout,
                           env=self._verifier_env)
        nonce = secrets.token_hex(8)  # the agent's output cannot forge a section header
        files = await sb.run(["/bin/sh", "-c", f"for f in {REWARD_JSON} {REWARD_TXT} {_STDOUT}; "
                              f"do if [ -f \"$f\" ]; then echo \"{nonce} $f\"; "
                              "head -c 65536 \"$f\"; echo; fi; done"],
                             timeout_s=60, max_output_bytes=1 << 20)
        found = _sections(files.stdout, nonce)
        output = found.get(_STDOUT) or ""
        info: dict[str, Any] = {"verifier_exit_code": run.exit_code,  # the output's end
                                "verifier_output": clean_text(output[-4000:], 4000)}
        if run.timed_out:
            info["verifier_error"] = "timeout"
            return 0.0, f"The tests ran past their time limit ({timeout:g} s): reward 0.", info
        reward, problem = _parse_reward(found.get(REWARD_JSON), found.get(REWARD_TXT))
        if problem:
            info["verifier_error"] = problem
            return 0.0, f"{problem}: reward 0.", info
        return reward, "", info


def _empty_tar(data: bytes) -> bool:
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return tar.next() is None
    except tarfile.TarError:
        return False  # copied as it is: unpacking it reports the problem


def _sections(text: str, nonce: str) -> dict[str, str]:
    """The files the reward-reading command printed, each after a ``NONCE PATH`` line."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith(nonce + " /logs/"):
            current = line[len(nonce) + 1:].strip()
            out[current] = ""
        elif current is not None:
            out[current] += line
    return {k: v[:-1] if v.endswith("\n") else v for k, v in out.items()}


def _parse_reward(json_text: str | None, txt: str | None) -> tuple[float, str]:
    """The reward from ``reward.json`` (first) or ``reward.txt``, or ``(0, problem)``."""
    if json_text is not None:
        try:
            value = json.loads(json_text)
        except ValueError:
            return 0.0, f"{REWARD_JSON} is not valid JSON"
        if isinstance(value, dict):
            value = value.get("reward", next(iter(value.values())) if len(value) == 1 else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            return 0.0, f"{REWARD_JSON} has no finite 'reward' number"
        return float(value), ""
    if txt is None:
        return 0.0, f"The tests wrote no reward file ({REWARD_TXT})"
    try:
        value = float(txt.strip())
    except ValueError:
        return 0.0, f"{REWARD_TXT} does not hold a number ({clean_text(txt.strip(), 60)!r})"
    if not math.isfinite(value):
        return 0.0, f"{REWARD_TXT} holds a non-finite number"
    return value, ""
