"""Server-sent events: what the servers' streamed answers share."""

from __future__ import annotations

import asyncio

from aiohttp import web


async def keep_alive(task: asyncio.Future, resp: web.StreamResponse, request: web.Request,
                     every_s: float) -> None:
    """Until ``task`` is done, a ``: keep-alive`` comment on the event stream every ``every_s``.

    A quick task sends none (the response is then not prepared yet, so an
    error can still be a plain HTTP error).
    """
    while True:
        done, _ = await asyncio.wait({task}, timeout=every_s)
        if done:
            return
        if not resp.prepared:
            await resp.prepare(request)
        await resp.write(b": keep-alive\n\n")
