"""The agent most people start with: the ``openai`` client in a loop, trained as it is.

It plays an environment's task (``sao_gym.gateway.tasks.start_env``): sends the
conversation and the env's tools, steps the env with each reply, and appends
what the env answers, until the episode ends. Its reward is the env's.

    sao-gym train --set env=sao_gym/KeyChain-v0 \\
        --set agent.program=examples.harnesses.openai_loop:run

Nothing here knows about training: pointed at ``https://api.openai.com/v1`` it
is the same agent.
"""

from __future__ import annotations

from sao_gym.gateway.tasks import start_env


async def run(client, task):
    """One episode of ``task`` with the chat model behind ``client``; the env's reward."""
    session, messages = await start_env(task)
    try:
        tools = {"tools": session.tools} if session.tools else {}
        while not session.done:
            reply = (await client.chat.completions.create(
                model="policy", messages=messages, **tools)).choices[0].message
            action = reply.model_dump(include={"role", "content", "tool_calls"},
                                      exclude_none=True)
            messages.append(action)
            messages += (await session.asend(action)).messages
        if session.infra_failure:
            raise RuntimeError("the environment failed (its log says why)")
        return session.reward
    finally:
        await session.aclose()
