"""Checking a proof script with ``coqc`` inside a sandbox, and judging the result.

The file the checker builds (fresh names ``N`` for every check)::

    <task context>
    Theorem sao_goal_N <signature of the task's statement>.
    Proof.
    Locate sao_start_N.           (markers the model cannot print: N is random)
    <the model's script>          (comments blanked; layout kept)
    Locate sao_show_N.
    Show.                         (the goals left, for the model)
    Qed.                          (the checker closes the proof: always Qed)
    Locate sao_mark_N.
    Print Assumptions sao_goal_N.
    <task epilogue>               (End S. for sections left open by the context)

A proof is accepted when ``coqc`` exits 0 and the output after the
``sao_mark_N`` marker is exactly ``Closed under the global context`` (inside a
section: only the section variables the proof uses). Two layers keep the model from gaming
this:

1. The script must be a *proof script*: tactics, bullets, braces, goal
   selectors and a few read-only queries (``Show``, ``Check``, ``Search``,
   ...). Any other Coq command (``Qed``, ``Admitted``, ``Abort``, ``Axiom``,
   ``Require``, ``Module``, ``Unset Guard Checking``, ...) is refused before
   Coq runs (:func:`prepare_script`). A leading ``Proof.`` and a final
   ``Qed.``/``Defined.`` are tolerated and dropped.
2. Coq's own verdict: the theorem carries a fresh random name, so a script
   that escaped the proof could not redeclare it; ``Qed`` rejects admitted
   and shelved goals; ``Print Assumptions`` lists axioms, admitted lemmas
   and disabled guard, positivity or universe checks; a section or module
   left open fails the file.
"""

from __future__ import annotations

import logging
import posixpath
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sao_gym.envs.coq_proof.coqlex import (
    CoqSyntaxError,
    Sentence,
    blank_comments,
    mask_strings,
    split_sentences,
)
from sao_gym.envs.coq_proof.tasks import CoqTask
from sao_gym.sandbox import Sandbox, SandboxUnavailable, make_sandbox

logger = logging.getLogger(__name__)

CLOSED = "Closed under the global context"
DOCKER_IMAGE = "sao-gym-sandbox-coq:latest"
"""The Docker image the env uses when a Docker sandbox names none (the default one has no Coq)."""
BUILD_HINT = ("sao-gym sandbox build-image --tag sao-gym-sandbox-coq:latest --extra-packages "
              "coq,ocaml-base,ocaml,libcoq-core-ocaml,libzarith-ocaml,libfindlib-ocaml")
MAX_SCRIPT_CHARS = 20_000
_COQC_OUTPUT_BYTES = 256 * 1024

QUERY_COMMANDS = frozenset({
    "Show", "Check", "Print", "Search", "SearchPattern", "SearchRewrite", "About", "Locate",
    "Compute", "Eval", "Unshelve", "Guarded", "Info",
})
"""Capitalised words a proof sentence may start with (read-only queries and proof-mode
commands that neither end the proof nor change the environment)."""
_CONTROL_RE = re.compile(r"(?:Time|Fail|Succeed|Timeout\s+\d+)\b\s*")
_BULLET_RE = re.compile(r"(?:[{}]|([-+*])\1*)\s*")
_SELECTOR_RE = re.compile(
    r"(?:all|par|!|\d+(?:\s*-\s*\d+)?(?:\s*,\s*\d+(?:\s*-\s*\d+)?)*|\[\s*[A-Za-z_][\w']*\s*\])"
    r"\s*:(?!=)\s*"
)
_WORD_RE = re.compile(r"[A-Za-z_][\w']*")
_ANY_WORD_RE = re.compile(r"(?<![\w'.])[A-Za-z_][\w']*")
FORBIDDEN_ANYWHERE = frozenset({
    "Qed", "Defined", "Admitted", "Abort", "Save", "Restart", "Undo", "Back", "BackTo",
    "Unset", "Require", "Load", "Declare", "Redirect", "Extraction", "Module", "Section",
    "Goal", "Theorem", "Lemma", "Axiom", "Axioms", "Parameter", "Parameters", "Conjecture",
    "Hypothesis", "Hypotheses", "Variable", "Variables", "Definition", "Fixpoint",
    "CoFixpoint",
})
"""Command words refused anywhere in a script (outside strings), not only at a sentence start."""
_HINTS = {
    "Admitted": "an admitted proof is not a proof; finish it with tactics",
    "Qed": "the checker closes the proof with Qed itself; do not close it early",
    "Defined": "the checker closes the proof with Qed itself; do not close it early",
    "Abort": "the proof cannot be abandoned",
    "Axiom": "declaring axioms is not allowed",
    "Parameter": "declaring axioms is not allowed",
    "Require": "the task's context fixes the imports",
    "Unset": "changing Coq's settings is not allowed",
}
_FILE = "SaoProof.v"
_LOCATION_RE = re.compile(r'File "\./SaoProof\.v", line (\d+), characters (\d+)-(\d+):\n')


_INCOMPLETE_RE = re.compile(r"incomplete proof|given up|shelved|unresolved existential",
                            re.IGNORECASE)


class ScriptRejected(ValueError):
    """The script is not a proof script (refused before running Coq)."""


@dataclass(frozen=True)
class PreparedScript:
    """A script ready to go between ``Proof.`` and ``Qed.``."""

    code: str
    """The script with comments (and a tolerated ``Proof.``/``Qed.``) blanked, layout kept."""
    sentences: tuple[Sentence, ...]
    """Its sentences, offsets into ``code``."""


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one proof script."""

    proved: bool
    """``coqc`` accepted the file and the theorem depends on no axiom."""
    status: str
    """``proved``, ``axioms``, ``incomplete``, ``error``, ``rejected``, ``timeout``,
    ``out_of_memory`` or ``task_error``."""
    message: str
    """What the model is told (Coq's messages, goals, the verdict)."""
    coq_seconds: float = 0.0
    """Time spent in ``coqc`` runs (sandbox included)."""


def tactic_names_in(context: str) -> frozenset[str]:
    """Capitalised tactic names that a context defines (``Ltac Foo``, ``Tactic Notation "Foo"``)."""
    names = set(re.findall(r"\bLtac\s+([A-Z][\w']*)", context))
    names |= set(re.findall(r"\bTactic\s+Notation\b[^.]*?\"([A-Z][\w']*)\"", context))
    return frozenset(names - FORBIDDEN_ANYWHERE)


def prepare_script(script: str, *, extra_tactics: frozenset[str] = frozenset()) -> PreparedScript:
    """Check that ``script`` is a proof script and return it ready for Coq.

    Raises:
        ScriptRejected: with a reason the model can act on.

    """
    if not isinstance(script, str):
        raise ScriptRejected("the script must be a string")
    if len(script) > MAX_SCRIPT_CHARS:
        raise ScriptRejected(f"the script is {len(script)} characters long; "
                             f"the limit is {MAX_SCRIPT_CHARS}")
    try:
        script.encode("utf-8")
    except UnicodeEncodeError:
        raise ScriptRejected("the script is not valid Unicode text (lone surrogates)") from None
    bad = next((c for c in script if ord(c) < 32 and c not in "\t\n\r"), None)
    if bad is not None:
        raise ScriptRejected(f"the script contains the control character {bad!r}")
    try:
        sentences = split_sentences(script)
    except CoqSyntaxError as e:
        raise ScriptRejected(f"{e} (Coq would read the rest of the file as part of it)") from None
    code = blank_comments(script)
    if sentences and _is_proof_opener(sentences[0]):
        code = _blank(code, sentences[0].start, sentences[0].end)
        sentences = sentences[1:]
    if sentences:
        last = sentences[-1]
        m = re.fullmatch(r"([\s{}]*)(Qed|Defined)(\s*\.?\s*)", last.code)
        if m is not None:
            code = _blank(code, last.start + m.end(1), last.end)
            sentences = sentences[:-1]
            if m.group(1).strip():
                sentences.append(Sentence(last.start, last.start + m.end(1),
                                          code[last.start:last.start + m.end(1)], False))
    if not sentences:
        raise ScriptRejected("the script is empty: write the tactics that prove the theorem")
    for index, sentence in enumerate(sentences):
        _check_sentence(sentence, index, extra_tactics)
    if sentences and not sentences[-1].terminated:
        last = sentences[-1]
        if not _strip_structure(last.body):
            if last.body.strip(" \t\r\n{}"):
                raise ScriptRejected(f"the script ends with an incomplete sentence "
                                     f"{last.body.strip()[:60]!r}")
            return PreparedScript(code, tuple(sentences))
        stripped_end = last.start + len(last.code.rstrip())
        code = code[:stripped_end] + "." + code[stripped_end:]
        sentences[-1] = Sentence(last.start, stripped_end + 1, code[last.start:stripped_end + 1],
                                 True)
    return PreparedScript(code, tuple(sentences))


def _blank(code: str, start: int, end: int) -> str:
    return code[:start] + "".join(c if c == "\n" else " " for c in code[start:end]) + code[end:]


def _is_proof_opener(sentence: Sentence) -> bool:
    return sentence.terminated and sentence.body == "Proof"


def _strip_structure(body: str) -> str:
    """Drop leading bullets, braces, goal selectors and control prefixes."""
    rest = body.lstrip()
    while True:
        m = _BULLET_RE.match(rest) or _SELECTOR_RE.match(rest) or _CONTROL_RE.match(rest)
        if m is None or not m.group(0):
            return rest
        rest = rest[m.end():].lstrip()


def _check_sentence(sentence: Sentence, index: int, extra_tactics: frozenset[str]) -> None:
    masked = mask_strings(sentence.body)
    where = f"sentence {index + 1} ({' '.join(sentence.body.split())[:60]!r})"
    for word in _ANY_WORD_RE.findall(masked):
        if word in FORBIDDEN_ANYWHERE:
            hint = _HINTS.get(word, "a proof script may contain only tactics")
            raise ScriptRejected(f"{where}: `{word}` is not allowed in a proof script ({hint})")
    rest = _strip_structure(masked)
    if not rest:
        return
    m = _WORD_RE.match(rest)
    if m is not None:
        word = m.group(0)
        if word[0].islower() or word[0] == "_" or word in QUERY_COMMANDS or word in extra_tactics:
            return
        hint = _HINTS.get(word, "a proof script may contain only tactics (and the queries "
                                f"{', '.join(sorted(QUERY_COMMANDS))})")
        raise ScriptRejected(f"{where}: `{word}` is a Coq command, not a tactic ({hint})")
    if rest[0] in "([":
        return
    raise ScriptRejected(f"{where}: a tactic cannot start with {rest[0]!r}")


# ----- building and judging the file ---------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    text: str
    header_line: int
    script_line: int
    script_lines: int
    qed_line: int


def _build(task: CoqTask, code: str, nonce: str, *, complete: bool = True) -> _Layout:
    head = task.context.rstrip("\n") + "\n\n" if task.context.strip() else ""
    header = f"Theorem sao_goal_{nonce} {task.signature}.\nProof.\nLocate sao_start_{nonce}.\n"
    header_line = head.count("\n") + 1
    parts = [head, header, code, "\n"]
    script_line = header_line + header.count("\n")
    qed_line = script_line + code.count("\n") + 3
    parts.append(f"Locate sao_show_{nonce}.\nShow.\n")
    if complete:
        parts.append(f"Qed.\nLocate sao_mark_{nonce}.\nPrint Assumptions sao_goal_{nonce}.\n")
        parts.append(task.epilogue)
    return _Layout("".join(parts), header_line, script_line, code.count("\n") + 1, qed_line)


def judge_assumptions(output: str) -> bool:
    """Whether ``Print Assumptions`` output says: no axioms (section variables allowed)."""
    lines = [ln.strip() for ln in output.strip().splitlines()]
    if lines == [CLOSED]:
        return True
    # Inside a section, the variables the proof uses are listed (and nothing else
    # when there is no axiom); they become hypotheses when the section closes.
    headings = {"Axioms:", "Theory:", "Opaque constants:", "Transparent constants:", CLOSED}
    return len(lines) > 1 and lines[0] == "Section Variables:" \
        and not (set(lines) & headings) \
        and not any("assumed to be" in ln or "relies on" in ln for ln in lines)


class CoqChecker:
    """Runs ``coqc`` on proof attempts in one sandbox (started at first use).

    Args:
        sandbox: a :func:`sao_gym.sandbox.make_sandbox` spec or a started or
            unstarted :class:`~sao_gym.sandbox.Sandbox` (then owned by the checker).
        timeout_s: wall-clock limit of one ``coqc`` run.
        goals_on_error: on a tactic error, run Coq a second time on the
            script before the failing sentence to show the goals there.
        max_message_chars: cut messages to the model to this size.

    Raises:
        SandboxError: (from :meth:`check`) the sandbox failed, or has no ``coqc``:
            an infrastructure failure, never the model's.

    """

    def __init__(
        self,
        sandbox: str | Mapping[str, Any] | Sandbox = "local",
        *,
        timeout_s: float = 30.0,
        goals_on_error: bool = True,
        max_message_chars: int = 6000,
    ):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_message_chars < 200:
            raise ValueError(f"max_message_chars must be >= 200, got {max_message_chars}")
        self._spec = sandbox
        self._sandbox: Sandbox | None = sandbox if isinstance(sandbox, Sandbox) else None
        self.timeout_s = float(timeout_s)
        self.goals_on_error = goals_on_error
        self.max_message_chars = max_message_chars
        self._env: dict[str, str] | None = None
        self._runs = 0

    async def _ready(self) -> tuple[Sandbox, dict[str, str]]:
        if self._sandbox is None:
            self._sandbox = make_sandbox(self._spec)  # type: ignore[arg-type]
        if self._env is None:
            await self._sandbox.start()
            probe = await self._sandbox.run(
                "command -v coqc >/dev/null 2>&1 || exit 127; coqc -where", timeout_s=30
            )
            where = probe.stdout.strip().splitlines()[-1:] if probe.ok else []
            if not where or not where[0].startswith("/"):
                raise SandboxUnavailable(
                    "coqc is not available inside the sandbox "
                    f"(exit {probe.exit_code}: {probe.stderr.strip()[:200]}); install Coq "
                    f"(apt-get install coq) or, for Docker, build an image with `{BUILD_HINT}`"
                )
            # Coq loads its plugins through findlib; the sandbox may not see
            # /etc/ocamlfind.conf, so point findlib at Coq's own library tree.
            self._env = {"OCAMLFIND_CONF": "/dev/null",
                         "OCAMLPATH": posixpath.dirname(where[0].rstrip("/"))}
        return self._sandbox, self._env

    async def _coqc(self, text: str) -> tuple[Any, float]:
        sandbox, env = await self._ready()
        self._runs += 1
        folder = f"sao_coq_{self._runs}"
        await sandbox.write_file(f"{folder}/{_FILE}", text)
        t0 = time.perf_counter()
        result = await sandbox.run(
            f"cd {folder} && coqc -q {_FILE}; s=$?; cd .. && rm -rf {folder}; exit $s",
            timeout_s=self.timeout_s, env=env, max_output_bytes=_COQC_OUTPUT_BYTES,
        )
        return result, time.perf_counter() - t0

    async def aclose(self) -> None:
        """Close the sandbox (idempotent)."""
        sandbox, self._sandbox, self._env = self._sandbox, None, None
        if sandbox is not None:
            await sandbox.aclose()

    def _cut(self, text: str) -> str:
        text = text.strip()
        if len(text) > self.max_message_chars:
            omitted = len(text) - self.max_message_chars
            text = text[: self.max_message_chars] + f"\n... [{omitted} more characters cut]"
        return text

    async def check(self, task: CoqTask, script: str, *, show_goals: bool = True) -> CheckResult:
        """Judge ``script`` as a proof of ``task``; ``show_goals`` allows a second run."""
        try:
            prepared = prepare_script(script, extra_tactics=tactic_names_in(task.context))
        except ScriptRejected as e:
            return CheckResult(False, "rejected", self._cut(f"Rejected before running Coq: {e}"))
        nonce = secrets.token_hex(8)
        layout = _build(task, prepared.code, nonce)
        result, seconds = await self._coqc(layout.text)
        verdict = self._judge(task, prepared, layout, nonce, result)
        if verdict is None:  # a tactic error inside the script: maybe show the goals there
            status, message, sentence = self._script_error(task, prepared, layout, nonce, result)
            if show_goals and self.goals_on_error and sentence is not None:
                prefix = _blank(prepared.code, sentence.start, len(prepared.code))
                goals_run, extra = await self._coqc(_build(task, prefix, nonce,
                                                           complete=False).text)
                seconds += extra
                goals = _after_marker(goals_run.stdout, f"sao_show_{nonce}")
                if goals is not None and goals.strip():
                    message += "\n\nGoals before that sentence:\n" + _rename(goals, nonce, task)
            return CheckResult(False, status, self._cut(message), seconds)
        return CheckResult(verdict[0] == "proved", verdict[0], self._cut(verdict[1]), seconds)

    def _judge(self, task: CoqTask, prepared: PreparedScript, layout: _Layout, nonce: str,
               result: Any) -> tuple[str, str] | None:
        if result.timed_out:
            return "timeout", (f"Coq did not finish within {self.timeout_s:g} s and was stopped "
                               "(a looping tactic or a too costly computation?).")
        if result.oom_killed:
            return "out_of_memory", "Coq ran out of memory and was stopped."
        stdout = _rename(result.stdout, nonce, task)
        if result.exit_code == 0:
            tail = _after_marker(result.stdout, f"sao_mark_{nonce}")
            if tail is None:
                return "error", "Coq's output was cut or garbled (too much output?)."
            tail = _rename(tail, nonce, task)
            if judge_assumptions(tail):
                return "proved", "Coq accepted the proof and it depends on no axioms."
            return "axioms", ("Coq accepted the proof, but it depends on axioms or unsafe "
                              "settings, so it does not count:\n" + tail.strip())
        stderr = _rename(result.stderr, nonce, task)
        m = _LOCATION_RE.search(result.stderr)
        line = int(m.group(1)) if m else None
        if line is not None and layout.script_line <= line < layout.script_line + \
                layout.script_lines:
            return None
        if line == layout.qed_line:
            reason = _error_text(stderr)
            if not _INCOMPLETE_RE.search(reason):
                return "error", f"Coq rejected the proof at Qed:\n{reason}"
            goals = _after_marker(result.stdout, f"sao_show_{nonce}") or ""
            return "incomplete", (f"The proof is not finished ({reason}).\nRemaining goals:\n"
                                  f"{_rename(goals, nonce, task).strip()}")
        if _after_marker(result.stdout, f"sao_start_{nonce}") is None:
            logger.warning("task %s: Coq rejects its context or statement: %s", task.id,
                           stderr.strip()[:500])
            return "task_error", ("Coq rejected the task's own context or statement (the task "
                                  f"is broken, not your proof):\n{_error_text(stderr)}")
        return "error", f"Coq rejected the proof:\n{stderr.strip() or stdout.strip()}"

    def _script_error(self, task: CoqTask, prepared: PreparedScript, layout: _Layout,
                      nonce: str, result: Any) -> tuple[str, str, Sentence | None]:
        m = _LOCATION_RE.search(result.stderr)
        assert m is not None
        line = int(m.group(1)) - layout.script_line
        col_from, col_to = int(m.group(2)), int(m.group(3))
        lines = prepared.code.split("\n")
        offset = sum(len(ln) + 1 for ln in lines[:line])
        offset += len(lines[line].encode("utf-8")[:col_from].decode("utf-8", "ignore"))
        sentence = next((s for s in prepared.sentences if s.start <= offset < s.end), None)
        text = _error_text(_rename(result.stderr, nonce, task))
        quoted = f" `{' '.join(sentence.body.split())[:200]}`" if sentence else ""
        message = (f"Coq rejected the proof at line {line + 1}, characters {col_from}-{col_to} "
                   f"of your script{quoted}:\n{text}")
        output = _rename(result.stdout, nonce, task).strip()
        if output:
            message += f"\n\nOutput before the error:\n{output}"
        return "error", message, sentence


def _after_marker(stdout: str, marker: str) -> str | None:
    line = f"No object of basename {marker}\n"
    idx = stdout.rfind(line)
    return None if idx < 0 else stdout[idx + len(line):]


def _rename(text: str, nonce: str, task: CoqTask) -> str:
    text = text.replace(f"sao_goal_{nonce}", task.name)
    text = re.sub(rf"No object of basename sao_(start|show|mark)_{nonce}\n?", "", text)
    return _LOCATION_RE.sub("", text)


def _error_text(stderr: str) -> str:
    text = stderr.strip()
    text = re.sub(r"^Error:\s*", "", text)
    text = re.sub(r"^\(in proof [^)]*\):\s*", "", text)
    return text.strip()
