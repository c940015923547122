"""An OpenAI Agents SDK agent (``openai-agents``) with function tools, trained as it is.

The agent's tools are the environment's (``sao_gym.gateway.tasks.start_env``):
each becomes a :class:`agents.FunctionTool` whose call steps the env, and the
run stops once the env's episode is over. The reward is the env's.

    sao-gym train --set env=sao_gym/KeyChain-v0 \\
        --set agent.program=examples.harnesses.agents_sdk:run

(The SDK's package is called ``agents``; so is this repository's ``agents/``
folder, installed as ``sao_gym.agents``. Run from the repository root, put
``sao-gym``'s own directory first on ``sys.path``, as its console script does,
or run this file as a command harness: ``agent.command="python
examples/harnesses/agents_sdk.py"``.)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    Runner,
    ToolsToFinalOutputResult,
    set_tracing_disabled,
)
from sao_gym.gateway.tasks import start_env

set_tracing_disabled(True)  # the SDK would send traces to OpenAI


def env_tool(session, schema):
    """One env tool as an SDK function tool: a call steps the env, its answer is the text."""
    fn = schema["function"]

    async def invoke(ctx, arguments: str) -> str:
        return (await session.acall_tool(fn["name"], arguments)).text

    return FunctionTool(name=fn["name"], description=fn.get("description", ""),
                        params_json_schema=fn.get("parameters") or {"type": "object",
                                                                    "properties": {}},
                        on_invoke_tool=invoke, strict_json_schema=False)


async def run(client, task):
    """One episode of ``task`` by an Agents SDK agent on ``client``; the env's reward."""
    session, messages = await start_env(task)
    try:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        prompt = "\n".join(m["content"] for m in messages if m["role"] == "user")

        def stop_when_over(ctx, results):  # the env's episode ended: the agent is done
            return ToolsToFinalOutputResult(is_final_output=session.done,
                                            final_output="done" if session.done else None)

        agent = Agent(name="solver", instructions=system or None,
                      model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                      tools=[env_tool(session, t) for t in session.tools],
                      tool_use_behavior=stop_when_over)
        try:
            await Runner.run(agent, prompt, max_turns=int(task.get("max_turns", 32)))
        except (MaxTurnsExceeded, ModelBehaviorError):  # the model's failure: the task failed
            pass
        if session.infra_failure:
            raise RuntimeError("the environment failed (its log says why)")
        return session.reward
    finally:
        await session.aclose()


if __name__ == "__main__":  # a command harness: the task on stdin, the reward printed last
    import openai

    client = openai.AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"],
                                api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    print(json.dumps(asyncio.run(run(client, json.loads(sys.stdin.read())))))
