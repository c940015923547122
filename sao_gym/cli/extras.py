"""The one-line errors of a subcommand whose optional dependencies are not installed."""

from __future__ import annotations

import argparse
import importlib.util


def missing_train_extra() -> str | None:
    """A one-line error when the ``train`` extra (torch, transformers) is not installed."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"this command needs the `train` extra ({', '.join(missing)} not installed): "
                "pip install 'sao-gym[train]'")
    return None


def missing_extra(error: ModuleNotFoundError, args: argparse.Namespace) -> str | None:
    """One line naming the extra to install, when ``error`` is an optional module's absence.

    Every subcommand gets the hint ``train`` and ``eval`` give up front; a module
    that is installed but fails to import its own dependencies is left as it is.
    """
    from sao_gym.registration import OPTIONAL_MODULES, MissingExtra

    if isinstance(error, MissingExtra):
        return str(error)
    top = (error.name or "").partition(".")[0]
    if top not in OPTIONAL_MODULES or importlib.util.find_spec(top) is not None:
        return None
    command = " ".join(str(v) for k, v in vars(args).items()
                       if k == "command" or k.endswith("_command"))
    return str(MissingExtra(top, OPTIONAL_MODULES[top], f"sao-gym {command}"))

