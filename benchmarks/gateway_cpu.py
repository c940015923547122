"""Where the gateway path's CPU goes: the ``openai`` client's, and the sampling process's.

Two measurements, medians of ``--rounds``, on whatever machine runs it:

- ``client``: CPU per call of 32 concurrent loops of 6 chat calls (KeyChain-sized
  messages and two tools) against a canned aiohttp server in the same process,
  made with the official ``openai`` client and with bare aiohttp: the client's
  own share of a harness's work;
- ``sampling_process``: CPU per model call of the process that samples, with an
  instant scripted backend (the tiny model's tokenizer, a fixed reply): the
  ``LLMAgent`` path (agent and env in that process) against the gateway path
  with the harness (examples/harnesses/openai_loop.py) in one worker process,
  so what is left is the gateway's own work (HTTP, JSON, request checks,
  matching, the shared rendering).

Run: .venv/bin/python benchmarks/gateway_cpu.py --rounds 5 --out docs/data/gateway_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples.harnesses

REPLY = {"id": "x", "object": "chat.completion", "created": 0, "model": "policy",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": None, "tool_calls": [{
                 "id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"key\": \"abc\"}"}}]}}],
         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {name} tool.",
    "parameters": {"type": "object", "properties": {arg: {"type": "string"}},
                   "required": [arg]}}} for name, arg in (("lookup", "key"), ("submit", "value"))]


async def client_cpu(rounds: int) -> dict[str, float]:
    """CPU ms per call: the ``openai`` client, and bare aiohttp, on a canned server."""
    import aiohttp
    import openai
    from aiohttp import web

    body = json.dumps(REPLY).encode()

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", answer)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore
    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    http = aiohttp.ClientSession()

    async def loop(kind: str) -> None:
        messages = [{"role": "system", "content": "You follow a chain of keys."},
                    {"role": "user", "content": "Start at key abc; submit the last value."}]
        for _ in range(6):
            if kind == "openai":
                reply = (await client.chat.completions.create(
                    model="policy", messages=messages, tools=TOOLS)).choices[0].message
                action = reply.model_dump(include={"role", "content", "tool_calls"},
                                          exclude_none=True)
            else:
                async with http.post(f"{url}/chat/completions", json={
                        "model": "policy", "messages": messages, "tools": TOOLS}) as resp:
                    action = (await resp.json())["choices"][0]["message"]
            messages += [action, {"role": "tool", "tool_call_id": "call_1", "content": "def"}]

    out: dict[str, list[float]] = {"openai": [], "aiohttp": []}
    try:
        for kind in out:
            await asyncio.gather(*(loop(kind) for _ in range(32)))  # warm
        for _ in range(rounds):
            for kind in out:
                start = time.process_time()
                await asyncio.gather(*(loop(kind) for _ in range(32)))
                out[kind].append((time.process_time() - start) / (32 * 6) * 1e3)
    finally:
        await client.close()
        await http.close()
        await runner.cleanup()
    return {f"{k}_cpu_ms_per_call": round(statistics.median(v), 3) for k, v in out.items()}


async def sampling_process_cpu(rounds: int) -> dict[str, float]:
    """CPU ms per model call of the sampling process: LLMAgent path, gateway path."""
    from transformers import AutoTokenizer

    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.evaluation import play_seeds, run_episodes
    from sao_gym.gateway.harness import Harness
    from sao_gym.gateway.rollouts import HarnessRollouts
    from sao_gym.gateway.tasks import TaskSource
    from sao_gym.inference.scripted import ScriptedBackend
    from sao_gym.models import IM_END, tiny_model

    tok = AutoTokenizer.from_pretrained(tiny_model(tempfile.mkdtemp()))
    reply = tok.encode("lookup(4817)", add_special_tokens=False) + [
        tok.convert_tokens_to_ids(IM_END)]
    backend = ScriptedBackend(lambda prompt, params: reply)
    make_env = functools.partial(sao_gym.make, "sao_gym/KeyChain-v0", hops=4)
    make_agent = functools.partial(LLMAgent, backend, tok, max_new_tokens=24,
                                   temperature=0.0, max_context_tokens=1024)
    runs = HarnessRollouts(Harness("examples.harnesses.openai_loop:run", timeout_s=600),
                           TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": 4}),
                           backend, tok, max_new_tokens=24, max_context_tokens=1024,
                           temperature=0.0, workers=1)

    async def play(kind: str, episodes: int, seed: int) -> None:
        if kind == "llm_agent":
            await run_episodes(make_env, make_agent, episodes, concurrency=32, seed=seed)
        else:
            await play_seeds(runs.play, episodes, concurrency=32, seed=seed)

    out: dict[str, list[float]] = {"llm_agent": [], "gateway_workers_1": []}
    try:
        for kind in out:
            await play(kind, 8, 10_000)  # warm: imports, the worker, connections
        for r in range(rounds):
            for kind in out:
                calls, start = len(backend.calls), time.process_time()
                await play(kind, 128, 1000 * r)
                out[kind].append((time.process_time() - start)
                                 / (len(backend.calls) - calls) * 1e3)
    finally:
        await runs.aclose()
    return {f"{k}_cpu_ms_per_call": round(statistics.median(v), 3) for k, v in out.items()}


async def run(args: argparse.Namespace) -> dict:
    return {"rounds": args.rounds, "client": await client_cpu(args.rounds),
            "sampling_process": await sampling_process_cpu(args.rounds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
