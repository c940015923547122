"""``sao-gym sandbox``: sandbox maintenance (the DockerSandbox image)."""

from __future__ import annotations

import argparse
import sys


def cmd_sandbox_build_image(args: argparse.Namespace) -> int:
    """``sao-gym sandbox build-image``: the DockerSandbox image, offline."""
    from sao_gym.sandbox.base import SandboxUnavailable
    from sao_gym.sandbox.image import build_image

    packages = [p.strip() for p in args.extra_packages.split(",") if p.strip()]
    try:
        image_id = build_image(args.tag, extra_packages=packages, rebuild=args.rebuild)
    except (SandboxUnavailable, RuntimeError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    print(f"{args.tag} {image_id}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``sandbox`` to the subcommands of ``sao-gym``."""
    sandbox = sub.add_parser("sandbox", help="sandbox maintenance")
    sandbox_sub = sandbox.add_subparsers(dest="sandbox_command", required=True)
    build = sandbox_sub.add_parser("build-image", help="build the DockerSandbox image offline "
                                   "(debootstrap + docker import; needs root and a daemon)")
    build.add_argument("--tag", default="sao-gym-sandbox:latest")
    build.add_argument("--extra-packages", default="", help="comma-separated Debian packages")
    build.add_argument("--rebuild", action="store_true", help="rebuild when the tag exists")
    build.set_defaults(fn=cmd_sandbox_build_image)
