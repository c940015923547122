"""A fake inference server (aiohttp) that speaks just enough of vLLM's protocol."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

MAX_LEN = 64
GOOD_INFO = {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}}
MODELS = {"data": [{"id": "policy", "max_model_len": MAX_LEN}]}


class Fake:
    """One fake server: its behaviour (``mode``s) and what it received (``calls``)."""

    def __init__(self, completions: str = "ok", reload: str = "ok",
                 versions: list[int] | None = None, server_info: bool = True):
        self.completions, self.reload, self.versions = completions, reload, versions
        self.has_server_info = server_info
        self.calls: list[tuple[str, object]] = []
        self.bodies: list[dict] = []
        self.url = ""
        self.streaming, self.resumed = asyncio.Event(), asyncio.Event()
        self.reloading = asyncio.Event()
        self.hold_reload: asyncio.Event | None = None
        """When set to an event, a reload answers only once that event is set."""

    def count(self, path: str) -> int:
        return sum(p == path for p, _ in self.calls)

    def app(self) -> web.Application:
        async def models(request):
            self.calls.append(("/v1/models", None))
            return web.json_response(MODELS)

        async def server_info(request):
            self.calls.append(("/server_info", None))
            if not self.has_server_info:
                raise web.HTTPNotFound()
            return web.json_response(GOOD_INFO)

        async def pause(request):
            self.calls.append(("/pause", dict(request.query)))
            return web.json_response({})

        async def resume(request):
            self.calls.append(("/resume", None))
            self.resumed.set()
            await asyncio.sleep(0.1)  # answers after streams had time to go on
            return web.json_response({})

        async def rpc(request):
            self.calls.append(("/collective_rpc", await request.json()))
            self.reloading.set()
            if self.hold_reload is not None:
                await self.hold_reload.wait()
            if self.reload == "500":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            return web.json_response({"results": [None]})

        async def version(request):
            self.calls.append(("/update_weight_version", await request.json()))
            return web.json_response({})

        async def completions(request):
            body = await request.json()
            self.calls.append(("/v1/completions", None))
            self.bodies.append(body)
            if self.completions == "500":
                return web.json_response({"error": {"message": "engine dead"}}, status=500)
            if self.completions == "400":
                return web.json_response({"error": {"message": "max_tokens is too large",
                                                    "type": "BadRequestError", "code": 400}},
                                         status=400)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            first = {"token_ids": [11, 12], "logprobs": {"token_logprobs": [-0.5, -1.5]},
                     "finish_reason": None}
            if self.versions is not None:
                first["policy_versions"] = self.versions[:2]
            await resp.write(b": keep-alive\n\n")
            await resp.write(b"data: " + json.dumps({"choices": [first]}).encode() + b"\n\n")
            if self.completions == "drop":
                request.transport.close()  # the server dies mid-stream
                return resp
            if self.completions == "cut":
                await resp.write_eof()  # a clean end, but no finish reason
                return resp
            if self.completions == "hold":  # the last chunk once /resume has arrived
                self.streaming.set()
                await self.resumed.wait()
            last = {"token_ids": [13], "logprobs": {"token_logprobs": [-0.25]},
                    "finish_reason": "length"}
            if self.versions is not None:
                last["policy_versions"] = self.versions[2:]
            await resp.write(b"data: " + json.dumps({"choices": [last]}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp

        app = web.Application()
        app.add_routes([web.get("/v1/models", models), web.get("/server_info", server_info),
                        web.post("/pause", pause), web.post("/resume", resume),
                        web.post("/collective_rpc", rpc),
                        web.post("/update_weight_version", version),
                        web.post("/v1/completions", completions)])
        return app
