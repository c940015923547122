"""``sao-gym view``: a local web app over run directories (aiohttp, static front end).

Routes (all ``GET``; runs are addressed by their position on the command
line, splits by name, episodes by id, so no URL names a file):

- ``/`` and ``/static/<file>``: the front end (``sao_gym/viewer/static``; only
  the files shipped there are served);
- ``/api/runs``: each run's name, path, splits and steps logged;
- ``/api/runs/<run>/metrics?after=<step>``: ``metrics.jsonl`` rows after a step
  (the curves poll it, so they follow a run that is training);
- ``/api/runs/<run>/splits/<split>/episodes?...``: a page of a split's episode
  list, filtered and sorted (:mod:`sao_gym.viewer.query`);
- ``/api/runs/<run>/splits/<split>/episodes/<id>``: one stored record as it is
  on disk (docs/metrics.md).

Every answer carries a Content-Security-Policy that allows only the app's own
scripts, and ``X-Content-Type-Options: nosniff``; the front end puts every
string of a model or an environment into the page as text, never as markup.
Anything unknown is a 404; a malformed query a 400 with the reason.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from sao_gym.rollout_store import PARSE_CHUNK, RolloutReader, check_split
from sao_gym.viewer.query import listed, plan, query

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
"""Only the app's own files run; inline styles (set by the charting library) are allowed."""

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
          ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain"}


class RunNotFound(web.HTTPNotFound):
    """A URL that names no run, split or episode."""


def check_run_dirs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The run directories to serve; ValueError for a path that is not one."""
    if not paths:
        raise ValueError("name at least one run directory")
    out = []
    for p in paths:
        path = Path(p).resolve()
        if not path.is_dir():
            raise ValueError(f"{p}: no such directory")
        if not any((path / name).exists() for name in ("metrics.jsonl", "rollouts",
                                                         "config.yaml")):
            raise ValueError(f"{p} is not a run directory (no metrics.jsonl, rollouts/ or "
                             "config.yaml)")
        out.append(path)
    return out


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Metrics:
    """``metrics.jsonl`` of one run, re-read when it changes."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self._stamp: tuple[int, int] | None = None
        self.rows: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        from sao_gym.logging import read_metrics

        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self.rows = read_metrics(self.path)
            except ValueError:  # corrupt beyond a torn line: show what was there
                logger.warning("cannot read %s", self.path, exc_info=True)
            self._stamp = stamp
        return self.rows


class Viewer:
    """The app's state: the runs, a reader and a metrics cache per run.

    A run's reader is used by one thread at a time (its lock): the handlers read
    in worker threads, so the event loop keeps answering while a large index is
    read, and :meth:`preload` reads every index once at start-up.
    """

    def __init__(self, run_dirs: Sequence[Path]):
        self.run_dirs = list(run_dirs)
        self.readers = [RolloutReader(d) for d in self.run_dirs]
        self.metrics = [_Metrics(d) for d in self.run_dirs]
        self._locks = [threading.Lock() for _ in self.run_dirs]
        self.static = {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*")
                       if p.is_file()}

    def preload(self) -> None:
        """Parse every split's index now, a chunk at a time (filters and sorts need it all)."""
        for run, reader in enumerate(self.readers):
            for split in reader.splits():
                n = 0
                while True:
                    with self._locks[run]:
                        rows = reader.page(split, n, n + PARSE_CHUNK)
                    if not rows:
                        break
                    n += PARSE_CHUNK
                    time.sleep(0.002)  # a request waiting for the reader gets it first

    def _page(self, run: int, split: str, params: Any) -> dict[str, Any]:
        """A page of the split's list: unfiltered in write order without parsing the rest."""
        tests, sort, order, size, page = plan(params)  # a bad parameter: ValueError first
        with self._locks[run]:
            reader = self.readers[run]
            facets = {"stop_reason": reader.values(split, "stop_reason"),
                      "env": reader.values(split, "env_id")}
            if tests or sort != "id":
                return query(reader.episodes(split), params, lambda _: facets)
            total = reader.count(split)
            rows = reader.page(split, page * size, (page + 1) * size, reverse=order == "desc")
            return {"total": total, "page": page, "size": size,
                    "pages": max(1, -(-total // size)), "episodes": [listed(e) for e in rows],
                    "facets": facets}

    def _record(self, run: int, split: str, rid: int) -> bytes | None:
        with self._locks[run]:
            return self.readers[run].read_bytes(split, rid)

    def _splits(self, run: int) -> list[str]:
        return self.readers[run].splits()  # a directory listing: no reader state, no lock

    def _run(self, request: web.Request) -> int:
        raw = request.match_info["run"]
        if not raw.isdigit() or int(raw) >= len(self.run_dirs):
            raise RunNotFound(text=f"no run {raw!r}")
        return int(raw)

    def _split(self, request: web.Request, run: int) -> str:
        split = request.match_info["split"]
        try:
            check_split(split)
        except ValueError:
            raise RunNotFound(text="no such split") from None
        if split not in self._splits(run):
            raise RunNotFound(text=f"run {run} has no split {split!r}")
        return split

    # ----- routes -----
    async def index(self, request: web.Request) -> web.StreamResponse:
        """``/``: the front end's page."""
        return self._file("index.html")

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        """``/static/<file>``: a file shipped with the front end."""
        return self._file(request.match_info["path"])

    def _file(self, name: str) -> web.StreamResponse:
        path = self.static.get(name)  # only files shipped with the app
        if path is None:
            raise RunNotFound(text="not found")
        return web.Response(body=path.read_bytes(),
                            content_type=_TYPES.get(path.suffix, "application/octet-stream"),
                            charset="utf-8" if path.suffix in (".html", ".js", ".css") else None)

    async def runs(self, request: web.Request) -> web.Response:
        """``/api/runs``: name, path, splits and last step of each run."""
        out = []
        for i, (d, metrics) in enumerate(zip(self.run_dirs, self.metrics, strict=True)):
            rows = metrics.read()
            out.append({"run": i, "name": d.name, "path": str(d), "splits": self._splits(i),
                        "steps": rows[-1]["step"] if rows else 0})
        return web.json_response(out)

    async def run_metrics(self, request: web.Request) -> web.Response:
        """``/api/runs/<run>/metrics?after=<step>``: the metric rows after a step."""
        run = self._run(request)
        try:
            after = int(request.query.get("after", "0") or 0)
        except ValueError:
            raise web.HTTPBadRequest(text="after must be an integer") from None
        rows = [r for r in self.metrics[run].read() if r["step"] > after]
        return web.json_response({"rows": rows}, dumps=_dumps)

    async def episodes(self, request: web.Request) -> web.Response:
        """``.../episodes?...``: a page of the split's episode list."""
        run = self._run(request)
        split = self._split(request, run)
        try:
            page = await asyncio.to_thread(self._page, run, split, dict(request.query))
        except ValueError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        return web.json_response(page, dumps=_dumps)

    async def episode(self, request: web.Request) -> web.Response:
        """``.../episodes/<id>``: one stored record."""
        run = self._run(request)
        split = self._split(request, run)
        raw = request.match_info["id"]
        data = await asyncio.to_thread(self._record, run, split, int(raw)) if raw.isdigit() \
            else None
        if data is None:
            raise RunNotFound(text=f"no episode {raw!r} in {split}")
        return web.Response(body=data, content_type="application/json")


def _dumps(obj: Any) -> str:
    # metrics rows may hold null (non-finite); never NaN, which JSON.parse refuses
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


@web.middleware
async def _headers(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as e:  # 404, 400, 405: plain text
        response = web.Response(status=e.status, text=e.text or e.reason)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    return response


def make_app(run_dirs: Sequence[str | os.PathLike[str]]) -> web.Application:
    """The viewer's aiohttp application over ``run_dirs`` (:func:`check_run_dirs`)."""
    viewer = Viewer(check_run_dirs(run_dirs))
    app = web.Application(middlewares=[_headers])
    app["viewer"] = viewer

    async def preload(app: web.Application) -> None:  # in the background: requests go on
        app["preload"] = asyncio.ensure_future(asyncio.to_thread(viewer.preload))

    app.on_startup.append(preload)
    app.add_routes([
        web.get("/", viewer.index),
        web.get("/static/{path:.+}", viewer.static_file),
        web.get("/api/runs", viewer.runs),
        web.get("/api/runs/{run}/metrics", viewer.run_metrics),
        web.get("/api/runs/{run}/splits/{split}/episodes", viewer.episodes),
        web.get("/api/runs/{run}/splits/{split}/episodes/{id}", viewer.episode),
    ])
    return app


def serve(run_dirs: Sequence[str | os.PathLike[str]], *, host: str = "127.0.0.1",
          port: int = 8765, say: Any = print) -> None:
    """Serve the viewer until interrupted (``sao-gym view``)."""
    app = make_app(run_dirs)
    if not is_loopback(host):
        say(f"warning: serving on {host}: anyone who can reach this machine on port {port} "
            "can read these runs (their prompts, rollouts and metrics)")
    say(f"sao-gym view: http://{'[' + host + ']' if ':' in host else host}:{port}/ "
        "(Ctrl-C stops)")
    web.run_app(app, host=host, port=port, print=None, access_log=None)
