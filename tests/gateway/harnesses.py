"""Harnesses of the tests: small programs that call the chat API as agents do.

As a module (``python -m tests.gateway.harnesses MODE``) it is a command harness:
the task on stdin, ``OPENAI_BASE_URL`` from the environment, the reward printed last.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]


def _messages(task):
    return [{"role": "system", "content": "Find the value."},
            {"role": "user", "content": f"What is behind key {task['key']}?"}]


def _tool_answer(reply, task):
    calls = reply.tool_calls or []
    return [{"role": "assistant", "content": reply.content,
             "tool_calls": [c.model_dump() for c in calls]},
            *[{"role": "tool", "tool_call_id": c.id, "content": f"value: {task['value']}"}
              for c in calls]]


async def lookup_loop(client, task):
    """The openai client in a loop: call, run the tool, call again; reward: the answer."""
    messages = _messages(task)
    for _ in range(4):
        reply = (await client.chat.completions.create(model="policy", messages=messages,
                                                      tools=TOOLS)).choices[0].message
        if not reply.tool_calls:
            return float(str(task["value"]) in (reply.content or ""))
        messages += _tool_answer(reply, task)
    return 0.0


def sync_loop(client, task):
    """A synchronous harness (run in a thread with a sync client)."""
    reply = client.chat.completions.create(model="policy", messages=_messages(task),
                                           tools=TOOLS).choices[0].message
    return 0.5 if reply.tool_calls else 0.25


async def rewrites(client, task):
    """Calls once, then sends a summarised history (another system prompt): two segments."""
    await client.chat.completions.create(model="policy", messages=_messages(task), tools=TOOLS)
    summary = [{"role": "system", "content": "Summary: you looked up the key already."},
               {"role": "user", "content": "Say the value."}]
    await client.chat.completions.create(model="policy", messages=summary, tools=TOOLS)
    return 1.0


async def posts_reward(client, task):
    """Posts 0.75 to /episodes/ID/reward, returns 0.1 (the posted one wins)."""
    await client.chat.completions.create(model="policy", messages=_messages(task))
    url = str(client.base_url).rstrip("/").removesuffix("/v1") + "/reward"
    async with aiohttp.ClientSession() as http, http.post(url, json={"reward": 0.75}) as r:
        assert r.status == 200, await r.text()
    return 0.1


async def crashes(client, task):
    await client.chat.completions.create(model="policy", messages=_messages(task))
    raise RuntimeError("the agent's own bug")


async def hangs(client, task):
    await client.chat.completions.create(model="policy", messages=_messages(task))
    await asyncio.sleep(3600)


async def no_reward(client, task):
    await client.chat.completions.create(model="policy", messages=_messages(task))


async def no_call(client, task):
    return 1.0


async def says_text(client, task):
    await client.chat.completions.create(model="policy", messages=_messages(task))
    return "great"


async def reports_pid(client, task):
    """Prints to standard output (the harness's own log), returns its process id.

    With ``task["die"]`` its process dies instead; with ``task["wait"]`` it waits that
    many seconds first.
    """
    await asyncio.sleep(task.get("wait", 0))
    if task.get("die"):
        os._exit(7)
    print("a harness's log line on standard output")
    print(json.dumps({"done": 1, "reward": -1}))  # looks like the worker protocol
    return float(os.getpid())


async def waits_for_cancel(client, task):
    """Waits until cancelled, then leaves a mark at ``task["marker"]``."""
    from pathlib import Path

    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        Path(task["marker"]).write_text(str(os.getpid()))
        raise


def final_has_value(task, transcript):
    """A verifier: 1 if the last reply names the task's value."""
    return float(str(task["value"]) in (transcript[-1].get("content") or ""))


def broken_verifier(task, transcript):
    raise KeyError("missing field")


def main() -> None:
    import openai

    mode = sys.argv[1]
    task = json.loads(sys.stdin.read())
    if mode == "fail":
        print("cannot reach the sandbox", file=sys.stderr)
        sys.exit(3)
    client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                           api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    reward = sync_loop(client, task)
    print("the agent's log line")
    print(json.dumps(reward * 2 if mode == "double" else reward))


if __name__ == "__main__":
    main()
