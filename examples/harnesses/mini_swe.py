"""mini-swe-agent (its bash-only action space) on CodeRepo tasks, trained as it is.

mini-swe-agent's own agent loop, prompts and model class (litellm, pointed at
the episode's base URL) run unmodified; only its *environment* is ours: each
``bash`` command runs in the task's sandbox through CodeRepo's ``bash`` tool,
and ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (mini-swe-agent's way to
finish) submits, so CodeRepo grades the repository with its hidden tests. The
reward is that grade.

    sao-gym train --set env=sao_gym/CodeRepo-v0 --set env_kwargs.tasks=humaneval \\
        --set agent.program=examples.harnesses.mini_swe:run

mini-swe-agent is synchronous: the function takes a synchronous client and
runs in a thread.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from sao_gym.adapters.session import EnvSession  # noqa: E402

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
litellm.suppress_debug_info = True  # its cost lookup of a local model name prints a banner


class SandboxEnvironment:
    """mini-swe-agent's environment protocol over a CodeRepo episode (its sandbox)."""

    def __init__(self, session: EnvSession):
        self.session = session

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        command = action.get("command", "") if isinstance(action, dict) else str(action)
        if command.strip() == f"echo {SUBMIT}":
            outcome = self.session.call_tool("submit", {})
            raise Submitted({"role": "exit", "content": outcome.text,
                             "extra": {"exit_status": "Submitted", "submission": outcome.text}})
        outcome = self.session.call_tool("bash", {"command": command})
        if self.session.done:  # the env ended the episode (its turn or token budget)
            raise Submitted({"role": "exit", "content": outcome.text,
                             "extra": {"exit_status": "EpisodeOver", "submission": ""}})
        status, _, output = outcome.text.partition("\n")  # CodeRepo: "exit code N\n<output>"
        match = re.match(r"exit code (-?\d+)", status)
        if match is None:  # a timeout, or the env refused the command: the whole text
            return {"output": outcome.text, "returncode": -1, "exception_info": status}
        return {"output": output, "returncode": int(match.group(1)), "exception_info": ""}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {"system": "Linux", "release": "", "version": "", "machine": "x86_64", **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment_type": type(self).__name__}}}


def run(client, task):
    """One CodeRepo episode by mini-swe-agent on ``client``'s model; the graded reward."""
    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    session = EnvSession(task["env_id"], **dict(task.get("env_kwargs") or {}))
    try:
        messages, _ = session.reset(seed=int(task["seed"]))
        issue = "\n".join(m["content"] for m in messages if m["role"] == "user")
        model = LitellmModel(
            model_name="openai/policy", cost_tracking="ignore_errors",
            model_kwargs={"api_base": str(client.base_url), "api_key": client.api_key},
            **{k: v for k, v in config["model"].items()
               if k in ("observation_template", "format_error_template")})
        agent_config = {k: v for k, v in config["agent"].items() if k != "mode"}
        agent_config["step_limit"] = int(task.get("step_limit", 16))
        agent = DefaultAgent(model, SandboxEnvironment(session), **agent_config)
        agent.run(task=issue)
        if session.infra_failure:
            raise RuntimeError("the environment failed (its log says why)")
        return session.reward
    finally:
        session.close()
