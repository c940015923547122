"""The verifiers adapter against the real verifiers 0.4, in a scratch venv of its own.

verifiers pins ``mcp==2.0.0`` and an openai 2.x the test venv cannot hold, so
the verifiers side runs in a cached scratch venv (built once, ~1-2 min; a
failed build fails these tests with pip's log) through
``verifiers_script.py``. The model is a stub OpenAI-compatible server on
127.0.0.1 (aiohttp, here) that replays the Arithmetic oracle as tool calls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import sao_gym
from sao_gym.agents.tool_parser import parse_tool_calls
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle
from tests.adapters.scratch_venv import ScratchVenvError, scratch_venv

SCRIPT = Path(__file__).with_name("verifiers_script.py")
# The repo's light dependencies (the repo itself goes in with --no-deps); uv runs
# verifiers' chat-loop harness (a PEP 723 script).
PACKAGES = ["verifiers==0.4.*", "uv", "gymnasium>=1.0", "aiohttp>=3.9", "numpy>=1.24",
            "pyyaml>=6.0", "rich>=13.0"]
ARITHMETIC = "sao_gym/Arithmetic-v0"
HEAVY_TAIL = "sao_gym/HeavyTail-v0"
HEAVY_TAIL_KW = {"latency_median_s": 0.01, "latency_sigma": 0.0, "turns_median": 2.0,
                 "turns_sigma": 0.0}
STUB_KEY_VAR = "SAO_GYM_STUB_MODEL_KEY"


@pytest.fixture(scope="module")
def vf_python() -> Path:
    """The scratch venv's python (built once, cached); a failed build fails the test."""
    try:
        return scratch_venv("verifiers", PACKAGES, install_self=True)
    except ScratchVenvError as e:
        pytest.fail(f"could not build the verifiers venv:\n{e}")


def run_script(python: Path, *args: str, timeout: float = 450) -> Any:
    """Run verifiers_script.py in the scratch venv; its last stdout line, parsed."""
    try:
        proc = subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, env={**_env(), STUB_KEY_VAR: "x"})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"verifiers_script.py {args[:1]} ran over {timeout} s: {e.stderr!r:.3000}")
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"script failed ({proc.returncode}):\n" \
        f"{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
    return json.loads(lines[-1])


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


# ----- the stub model -----
def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def oracle_message(body: dict[str, Any], wrong: bool) -> dict[str, Any]:
    """The oracle's next turn for the chat request ``body``, as an assistant message.

    The task comes from the question in the conversation; tool results get the
    tool's name from the call they answer, as sao_gym messages have it. After
    the submit result it answers in text (the rollout should have stopped).
    ``wrong``: submit the calculator's result plus one.
    """
    messages = body.get("messages") or []
    names = {c.get("id"): c.get("function", {}).get("name") for m in messages
             for c in m.get("tool_calls") or []}
    convo = [{**m, "content": _text(m.get("content")),
              "name": m.get("name") or names.get(m.get("tool_call_id"))} for m in messages]
    question = next((m["content"] for m in convo if m.get("role") == "user"), "")
    match = re.search(r"What is (.+)\?", question)
    if not match:
        return {"role": "assistant", "content": f"no question in {question!r}"}
    if convo and convo[-1].get("role") == "tool" and convo[-1].get("name") == "submit":
        return {"role": "assistant", "content": "(the episode should have stopped)"}
    text = arithmetic_oracle(convo, {"expression": match.group(1)})
    if wrong and text.startswith("submit("):
        value = float(text[len("submit("):-1]) + 1
        text = f"submit({int(value) if value.is_integer() else value})"
    content, calls = parse_tool_calls(text, body.get("tools") or [])
    return {"role": "assistant", "content": content or None, "tool_calls": calls or None}


class StubModel:
    """An OpenAI-compatible chat-completions server on 127.0.0.1, on its own thread.

    The model name picks the policy: ``stub-oracle`` replays the Arithmetic
    oracle, ``stub-wrong`` submits the right answer plus one, and a request
    without tools (a text env) gets ``TEXT_REPLY``. ``requests`` keeps every
    request body by model name.
    """

    TEXT_REPLY = "ok!!"

    def __init__(self) -> None:
        self.requests: dict[str, list[dict[str, Any]]] = {}
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> StubModel:
        self._thread.start()
        assert self._started.wait(10), "the stub model did not start"
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        """The ``/v1`` base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message for one request."""
        if not body.get("tools"):
            return {"role": "assistant", "content": self.TEXT_REPLY}
        return oracle_message(body, wrong=body.get("model") == "stub-wrong")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.setdefault(body.get("model", ""), []).append(body)
        message = self.reply(body)
        head = {"id": f"chatcmpl-stub-{next(self._ids)}", "created": int(time.time()),
                "model": body.get("model", "stub")}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            return web.json_response({**head, "object": "chat.completion", "usage": usage,
                                      "choices": [{"index": 0, "message": message,
                                                   "finish_reason": finish}]})
        delta: dict[str, Any] = {"role": "assistant"}
        if message.get("content"):
            delta["content"] = message["content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                  {"choices": [], "usage": usage}]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            event = {**head, "object": "chat.completion.chunk", **chunk}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


# The evaluations, run at once (each is mostly process start-up: verifiers starts a
# tool server and a chat-loop process per rollout): (model, env id, tasks, extra args).
# Alongside, the toolset's tool list for the built-in envs the scratch venv can make
# (MathTIR needs the `envs` extra).
TOOL_ENVS = [ARITHMETIC, "sao_gym/CoqProof-v0", "sao_gym/CodeRepo-v0", HEAVY_TAIL]
EVALS = {
    "oracle": ("stub-oracle", ARITHMETIC, 8, []),
    "wrong": ("stub-wrong", ARITHMETIC, 2, []),
    "text": ("stub-text", HEAVY_TAIL, 2, ["--env.taskset.env-kwargs", json.dumps(HEAVY_TAIL_KW)]),
}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubModel]:
    """The stub model server."""
    with StubModel() as server:
        yield server


@pytest.fixture(scope="module")
def runs(vf_python, stub, tmp_path_factory) -> dict[str, Any]:
    """The script's results: ``vf-eval`` of each of ``EVALS``, "tools" and "infra"."""
    out = tmp_path_factory.mktemp("vf-eval")

    def one(name: str) -> dict[str, Any]:
        if name == "tools":
            return run_script(vf_python, "tools", *TOOL_ENVS)
        if name == "infra":
            return run_script(vf_python, "infra")
        model, env_id, n, extra = EVALS[name]
        return run_script(vf_python, "eval", str(out), name, "--", "-m", model,
                          "--client.base-url", stub.base_url, "--client.api-key-var",
                          STUB_KEY_VAR, "--env.taskset.env", env_id, "-n", str(n),
                          "-c", str(n), *extra)

    names = [*EVALS, "tools", "infra"]
    with ThreadPoolExecutor(len(names)) as pool:
        results = dict(zip(names, pool.map(one, names), strict=True))
    for name in EVALS:
        result = results[name]
        assert result["returncode"] == 0, f"{name}: {result['log_tail']}"
        assert len(result["rollouts"]) == EVALS[name][2], f"{name}: {result['log_tail']}"
    return results


# ----- tests -----
def _env_tools(env_id: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The env's tool schemas at seed 0."""
    env = sao_gym.make(env_id, **kwargs)
    try:
        return env.reset(seed=0)[1].get("tools") or []
    finally:
        env.close()


def test_oracle_stub_replays_the_arithmetic_solution():
    env = sao_gym.make(ARITHMETIC)
    obs, info = env.reset(seed=4)
    body = {"messages": obs, "tools": info["tools"]}
    first = oracle_message(body, wrong=False)
    assert first["tool_calls"][0]["function"]["name"] == "calculator"
    obs2, *_ = env.step(first)
    call_id = first["tool_calls"][0]["id"]
    tool = [{"role": "tool", "tool_call_id": call_id, "content": obs2[-1]["content"]}]
    body["messages"] = [*obs, first, *tool]
    submit = oracle_message(body, wrong=False)
    assert json.loads(submit["tool_calls"][0]["function"]["arguments"]) == \
        {"answer": env.unwrapped.task["answer"]}
    wrong = oracle_message(body, wrong=True)
    assert float(json.loads(wrong["tool_calls"][0]["function"]["arguments"])["answer"]) == \
        float(env.unwrapped.task["answer"]) + 1
    _, reward, terminated, _, _ = env.step(submit)
    assert (reward, terminated) == (1.0, True)
    env.close()


def test_missing_verifiers_names_the_extra():
    try:
        import verifiers.v1  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("verifiers is installed in this venv")
    sys.modules.pop("sao_gym.adapters.verifiers", None)
    with pytest.raises(ImportError, match=r"pip install 'sao-gym\[verifiers\]'"):
        import sao_gym.adapters.verifiers  # noqa: F401


@pytest.mark.slow
def test_toolset_serves_the_env_tools_unchanged(runs):
    served = runs["tools"]
    for env_id in TOOL_ENVS:
        expected = [{"name": t["function"]["name"], "description": t["function"]["description"],
                     "input_schema": t["function"]["parameters"]} for t in _env_tools(env_id)]
        assert served[env_id] == expected  # the raw schemas: exactly equal
    assert [t["name"] for t in served[ARITHMETIC]] == ["calculator", "submit"]
    assert served[HEAVY_TAIL] == []  # a text env: no tools


@pytest.mark.slow
def test_vf_eval_with_the_oracle_scores_one(runs, stub):
    rollouts = runs["oracle"]["rollouts"]
    assert sorted(r["seed"] for r in rollouts) == list(range(8))
    assert [(r["ok"], r["errors"]) for r in rollouts] == [(True, [])] * 8
    assert sum(r["reward"] for r in rollouts) / len(rollouts) == 1.0
    assert {r["stop_condition"] for r in rollouts} == {"env_done"}
    assert all(r["sao_gym"]["terminated"] and r["sao_gym"]["stop_reason"] == "terminated"
               and r["sao_gym"]["step_rewards"] == [0.0, 1.0] for r in rollouts)
    assert all(r["metrics"] == {"env_steps": 2.0, "terminated": 1.0, "truncated": 0.0}
               for r in rollouts)
    # Two model calls per task (calculator, submit): @vf.stop refused the third.
    requests = stub.requests["stub-oracle"]
    assert len(requests) == 16
    # The model saw the env's tools unchanged, and so did the traces.
    expected = {t["function"]["name"]: t["function"] for t in _env_tools(ARITHMETIC)}
    for body in requests:
        assert {t["function"]["name"]: t["function"] for t in body["tools"]} == expected
    for r in rollouts:
        assert {t["name"]: {k: t[k] for k in ("name", "description", "parameters")}
                for t in r["tools"]} == expected
    # The env's system message opened the conversation, then its question.
    first = [b["messages"] for b in requests if len(b["messages"]) == 2]
    assert len(first) == 8 and all(m[0]["role"] == "system" and m[1]["role"] == "user"
                                   for m in first)


@pytest.mark.slow
def test_vf_eval_with_a_wrong_answer_scores_zero(runs, stub):
    rollouts = runs["wrong"]["rollouts"]
    assert [(r["ok"], r["errors"]) for r in rollouts] == [(True, [])] * 2
    assert sum(r["reward"] for r in rollouts) / len(rollouts) == 0.0
    assert {r["stop_condition"] for r in rollouts} == {"env_done"}
    assert all(r["sao_gym"]["terminated"] for r in rollouts)
    assert len(stub.requests["stub-wrong"]) == 4


@pytest.mark.slow
def test_vf_eval_steps_a_text_env_with_each_reply(runs, stub):
    rollouts = runs["text"]["rollouts"]
    assert [(r["ok"], r["errors"]) for r in rollouts] == [(True, [])] * 2
    # HEAVY_TAIL_KW fixes two turns; the reply has an even length, so the last step pays 1.
    assert [r["sao_gym"]["step_rewards"] for r in rollouts] == [[0.0, 1.0]] * 2
    assert [r["reward"] for r in rollouts] == [1.0, 1.0]
    assert all(r["metrics"]["env_steps"] == 2.0 and r["sao_gym"]["terminated"]
               for r in rollouts)
    assert all(not body.get("tools") for body in stub.requests["stub-text"])
    assert len(stub.requests["stub-text"]) == 4


@pytest.mark.slow
def test_an_env_failure_is_a_task_error_not_a_zero(runs):
    infra = runs["infra"]
    assert infra["is_error"] is True
    assert "ConnectionError: sandbox vanished" in infra["text"]
    state = infra["state"]
    assert (state["infra_failure"], state["done"], state["stop_reason"]) == \
        (True, True, "env_error")
    assert infra["error"]["type"] == "TaskError"
    assert "infrastructure failure of sao_gym/Arithmetic-v0" in infra["error"]["message"]
    assert state["step_rewards"] == []
    assert infra["rewards"] == {"env_reward": None}  # unscored, not 0
    failed_reset = infra["reset_failure"]
    assert failed_reset["tools"] == 0
    assert failed_reset["state"]["infra_failure"] and failed_reset["state"]["done"]
    assert "the reset failed (TypeError" in failed_reset["state"]["error"]
