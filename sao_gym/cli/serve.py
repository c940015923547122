"""``sao-gym serve`` (a model over vLLM's RL routes), ``sao-gym serve-env`` (an env, OpenEnv)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from sao_gym.cli.extras import missing_train_extra


def cmd_serve(args: argparse.Namespace) -> int:
    """``sao-gym serve MODEL``: a model over HTTP with vLLM's RL routes (HFBackend)."""
    missing = missing_train_extra()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from sao_gym.inference.server import serve
    from sao_gym.models import resolve_model

    if args.threads is not None and args.threads < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2

    logging.getLogger("sao_gym").setLevel(logging.INFO)
    try:
        path = resolve_model(args.model, Path(tempfile.mkdtemp(prefix="sao-gym-serve-")),
                             args.seed or 0)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {path} as {args.served_model_name!r} on http://{args.host}:{args.port}",
          flush=True)
    serve(path, host=args.host, port=args.port, served_model_name=args.served_model_name,
          max_batch_size=args.max_batch_size, max_model_len=args.max_model_len, seed=args.seed,
          dtype=args.dtype, threads=args.threads)
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    """``sao-gym serve-env ENV_ID``: an environment over OpenEnv's protocol."""
    try:
        kwargs = json.loads(args.env_kwargs) if args.env_kwargs else {}
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        print(f"error: --env-kwargs must be a JSON object, got {args.env_kwargs!r}",
              file=sys.stderr)
        return 2
    if args.max_sessions < 1:
        print(f"error: --max-sessions must be >= 1, got {args.max_sessions}", file=sys.stderr)
        return 2
    try:
        from sao_gym.adapters.openenv import create_app, serve_app

        app = create_app(args.env_id, max_concurrent_envs=args.max_sessions, **kwargs)
    except (ImportError, ValueError) as e:  # a missing extra, a bad env id or option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"serving {args.env_id} over OpenEnv on http://{args.host}:{args.port} "
          f"(WebSocket /ws, up to {args.max_sessions} sessions)", flush=True)
    serve_app(app, host=args.host, port=args.port)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` and ``serve-env`` to the subcommands of ``sao-gym``."""
    srv = sub.add_parser("serve", help="serve a model over HTTP with vLLM's RL routes "
                         "(completions with token ids and logprobs, pause/resume, reload)")
    srv.add_argument("model", help="a Hugging Face checkpoint directory, `tiny` or `smollm2`")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", default="policy")
    srv.add_argument("--max-batch-size", type=int, default=32,
                     help="most sequences decoded together")
    srv.add_argument("--max-model-len", type=int, default=None,
                     help="context limit (default: the model's positions)")
    srv.add_argument("--dtype", default="float32")
    srv.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: one per core)")
    srv.add_argument("--seed", type=int, default=None,
                     help="stream of requests sent without a seed")
    srv.set_defaults(fn=cmd_serve)
    senv = sub.add_parser("serve-env", help="serve an environment over OpenEnv's protocol "
                          "(reset/step over WebSocket, MCP list_tools/call_tool actions)")
    senv.add_argument("env_id")
    senv.add_argument("--host", default="127.0.0.1")
    senv.add_argument("--port", type=int, default=8000)
    senv.add_argument("--env-kwargs", metavar="JSON", default=None,
                      help='environment options as a JSON object, e.g. \'{"operators": "+"}\' '
                      '("max_episode_steps" sets the turn limit)')
    senv.add_argument("--max-sessions", type=int, default=32,
                      help="concurrent WebSocket sessions (each has its own environment)")
    senv.set_defaults(fn=cmd_serve_env)
