"""A small Coq lexer: comments, strings and sentences, as ``coqc`` splits them.

Enough of Coq's lexical rules to cut a file or a proof script into sentences
(the units ``coqc`` executes) without being fooled by comments or strings:

- comments ``(* ... *)`` nest, and a string inside a comment is lexed as a
  string (``(* "*)" *)`` is one comment), as Coq does;
- strings are ``"..."`` with ``""`` standing for a quote;
- a sentence ends at a ``.`` followed by whitespace or the end of the text,
  outside comments and strings.

Bullets (``-``, ``+``, ``*``) and braces (``{``, ``}``) that Coq treats as
sentences of their own stay at the start of the next sentence here; callers
that care (the proof-script check) strip them.

Example:
    >>> [s.code.strip() for s in split_sentences("intros. (* a. b *) auto.")]
    ['intros.', 'auto.']

"""

from __future__ import annotations

from dataclasses import dataclass


class CoqSyntaxError(ValueError):
    """Text that Coq could not lex either (an unterminated comment or string)."""


@dataclass(frozen=True)
class Sentence:
    """One sentence of a Coq text."""

    start: int
    """Offset of its first character (whitespace before it included) in the text."""
    end: int
    """Offset just past its terminating ``.`` (or the end of the text)."""
    code: str
    """Its text with comments replaced by spaces (newlines kept)."""
    terminated: bool
    """Whether it ends with a ``.`` (the last sentence of a text may not)."""

    @property
    def body(self) -> str:
        """The code without surrounding whitespace and without the final ``.``."""
        text = self.code.strip()
        return text[:-1].rstrip() if self.terminated else text


def _skip_string(text: str, i: int) -> int:
    """Index just past the string starting at ``text[i] == '"'``."""
    n = len(text)
    j = i + 1
    while j < n:
        if text[j] == '"':
            if j + 1 < n and text[j + 1] == '"':
                j += 2
                continue
            return j + 1
        j += 1
    raise CoqSyntaxError(f"unterminated string starting at offset {i}")


def _skip_comment(text: str, i: int) -> int:
    """Index just past the (nested) comment starting at ``text[i:i+2] == '(*'``."""
    n = len(text)
    depth, j = 0, i
    while j < n:
        if text.startswith("(*", j):
            depth += 1
            j += 2
        elif text.startswith("*)", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        elif text[j] == '"':
            try:
                j = _skip_string(text, j)
            except CoqSyntaxError:
                raise CoqSyntaxError(
                    f"unterminated string inside the comment starting at offset {i}"
                ) from None
        else:
            j += 1
    raise CoqSyntaxError(f"unterminated comment starting at offset {i}")


def blank_comments(text: str) -> str:
    """``text`` with every comment replaced by spaces (newlines kept), same length.

    Raises:
        CoqSyntaxError: an unterminated comment or string.

    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith("(*", i):
            j = _skip_comment(text, i)
            out.append("".join(c if c == "\n" else " " for c in text[i:j]))
            i = j
        elif text[i] == '"':
            j = _skip_string(text, i)
            out.append(text[i:j])
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def mask_strings(code: str) -> str:
    """``code`` (comments already blanked) with string contents replaced by ``_``."""
    out: list[str] = []
    i, n = 0, len(code)
    while i < n:
        if code[i] == '"':
            j = _skip_string(code, i)
            out.append('"' + "_" * (j - i - 2) + '"')
            i = j
        else:
            out.append(code[i])
            i += 1
    return "".join(out)


def split_sentences(text: str) -> list[Sentence]:
    """Cut ``text`` into sentences (comments blanked in each ``code``).

    A trailing fragment without a final ``.`` is returned as an unterminated
    sentence when it holds anything but whitespace.

    Raises:
        CoqSyntaxError: an unterminated comment or string.

    """
    code = blank_comments(text)
    sentences: list[Sentence] = []
    start, i, n = 0, 0, len(code)
    while i < n:
        c = code[i]
        if c == '"':
            i = _skip_string(code, i)
            continue
        if c == "." and (i + 1 == n or code[i + 1].isspace()):
            sentences.append(Sentence(start, i + 1, code[start:i + 1], True))
            start = i + 1
        i += 1
    if code[start:].strip():
        sentences.append(Sentence(start, n, code[start:], False))
    return sentences
