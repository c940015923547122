"""The docs show only flags that ``sao-gym`` has: every ``sao-gym SUB ... --flag`` in a
code block or code span of docs/*.md and README.md is an option of SUB's parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sao_gym.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
CLI_DOCS = [ROOT / "docs" / "metrics.md", ROOT / "docs" / "training.md"]
"""Docs about the CLI: a flag they show on its own (`--resume`) is a flag of some subcommand."""

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")  # a span may wrap onto the next line
COMMAND = re.compile(r"(?:^|(?<=[\s/(]))sao-gym[ \t]+(\S.*)")
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def all_parsers(parser: argparse.ArgumentParser, path: str = "sao-gym"):
    yield path, parser
    for name, sub in subparsers(parser).items():
        yield from all_parsers(sub, f"{path} {name}")


def code_texts(text: str) -> list[str]:
    """The fenced code blocks (continuation lines joined) and the inline code spans."""
    blocks = [b.replace("\\\n", " ") for b in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    return blocks + [s.replace("\n", " ") for s in SPAN.findall(prose)]


def commands(text: str) -> list[str]:
    """Each ``sao-gym ...`` command line: up to a comment, ``&&`` or ``;``."""
    found = []
    for code in code_texts(text):
        for line in code.splitlines():
            for part in re.split(r"&&|;", line.split(" #")[0]):
                match = COMMAND.search(part)
                if match:  # not `pip install sao-gym`
                    found.append(match.group(1).strip())
    return found


def problems_of(doc: Path) -> list[str]:
    parser = build_parser()
    text = doc.read_text()
    problems = []
    for command in commands(text):
        node, path, words = parser, "sao-gym", command.split()
        flags = []  # (parser's path, parser, flag)
        while subparsers(node) and words and (words[0] in subparsers(node)
                                               or words[0].startswith("-")):
            if words[0].startswith("-"):  # sao-gym -v check ...
                flags.append((path, node, words.pop(0)))
                continue
            path += " " + words[0]
            node = subparsers(node)[words.pop(0)]
        if subparsers(node):
            problems.append(f"`sao-gym {command}`: no such subcommand of {path}")
            continue
        flags += [(path, node, flag) for flag in FLAG.findall(" ".join(words))]
        for where, owner, flag in flags:
            if flag.split("=")[0] not in owner._option_string_actions:
                problems.append(f"`sao-gym {command}`: {where} has no {flag}")
    if doc in CLI_DOCS:
        known = {opt for _, p in all_parsers(parser) for opt in p._option_string_actions}
        for span in SPAN.findall(FENCE.sub("", text)):
            if span.startswith("--") and FLAG.match(span).group() not in known:
                problems.append(f"`{span}`: no sao-gym subcommand has {FLAG.match(span).group()}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_documented_flags_exist(doc):
    assert problems_of(doc) == []


def test_the_check_sees_wrong_flags(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("```bash\nsao-gym train --set a=1 \\\n    --nope\n"
                   "sao-gym bench async-vs-sync --repeats 2  # --comment is not a flag\n```\n"
                   "and `sao-gym plot RUN --compare\nRUN2 --smoth 0.5`, `sao-gym trian`\n")
    assert problems_of(doc) == [
        "`sao-gym train --set a=1      --nope`: sao-gym train has no --nope",
        "`sao-gym plot RUN --compare RUN2 --smoth 0.5`: sao-gym plot has no --smoth",
        "`sao-gym trian`: no such subcommand of sao-gym"]
