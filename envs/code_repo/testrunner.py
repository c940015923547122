"""A stdlib-only test runner that reports one outcome per test as JSON lines.

It runs *inside* the sandbox, where pytest may not be installed (LocalSandbox
exposes the standard library only), so it understands the common subset of
both worlds:

- ``unittest.TestCase`` subclasses (any name), run with ``unittest``;
- pytest-style ``test*`` functions and ``Test*`` classes with plain
  ``assert`` statements; a test module that imports ``pytest`` always gets
  a small stand-in module (also where pytest is installed, so that grading
  is the same in every sandbox): ``raises``, ``warns``,
  ``approx``, ``skip``, ``fail``, ``importorskip``, ``param``,
  ``mark.parametrize`` / ``skip`` / ``skipif`` / ``xfail`` / ``usefixtures``
  (other marks are ignored) and function-scoped ``fixture`` (yield fixtures,
  ``params``, ``autouse``, fixtures in ``conftest.py``), with the built-in
  fixtures ``monkeypatch``, ``tmp_path``, ``capsys`` and ``request``.

Test ids follow pytest's form: ``path::func``, ``path::Class::method`` and
``path::func[a-b]`` for parameters. Each test runs under a per-test time
limit (``SIGALRM``) with its output captured.

Protocol: the runner is started as ``python3 -s -B -c <this source>`` (with
``PYTHONHASHSEED=0``, so that ids built from sets are stable) and reads
one JSON object from stdin: ``root`` (repository directory), ``targets``
(test files relative to root), ``select`` (optional list of ids to run),
``timeout`` (seconds per test), ``conftest`` (``true``: load every
``conftest.py`` between root and the test file; a list: only those paths) and
``nonce``. Parameters given as a set are ordered by ``repr`` (set order can
change between runs), so ids are stable. It prints ``<nonce> {"id": ...,
"outcome": ..., "message": ...}`` lines, one per test as it finishes, then
``<nonce> {"done": true}``. Lines
without the nonce are test output that escaped capture and are ignored by the
host. Outcomes, as pytest reports them: ``passed``, ``failed`` (an assertion or any
exception in the test), ``error`` (a fixture or setup failed), ``skipped``,
``xfailed``, ``xpassed``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types
import unittest
import warnings

MESSAGE_LIMIT = 1500
RUNNER_FILE = sys._getframe().f_code.co_filename  # "<string>" under python -c


# ----- the pytest stand-in -------------------------------------------------------------
class Skipped(Exception):
    """``pytest.skip`` was called."""


class Failed(AssertionError):
    """``pytest.fail`` was called."""


class XFailed(Exception):
    """``pytest.xfail`` was called."""


class TestTimeout(BaseException):
    """The test ran past its time limit."""


class _Mark:
    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, tuple(args), dict(kwargs or {})

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not self.args:
            return _apply_mark(args[0], self)
        return _Mark(self.name, args, kwargs)


def _apply_mark(obj, mark):
    marks = list(getattr(obj, "pytestmark", []))
    marks.append(mark)
    try:
        obj.pytestmark = marks
    except (AttributeError, TypeError):
        pass
    return obj


class _MarkDecorator(_Mark):
    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (callable(args[0]) or inspect.isclass(args[0])):
            return _apply_mark(args[0], _Mark(self.name, self.args, self.kwargs))
        return _MarkDecorator(self.name, args, kwargs)


class _MarkGenerator:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _MarkDecorator(name)


class _Param:
    def __init__(self, values, id=None, marks=()):
        self.values, self.id = values, id
        self.marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]


def param(*values, id=None, marks=()):
    """``pytest.param``."""
    return _Param(values, id, marks)


class ExceptionInfo:
    """What ``pytest.raises`` yields."""

    def __init__(self):
        self.value = self.type = self.tb = None

    def match(self, pattern):
        """Assert that ``str(value)`` matches ``pattern``."""
        if not re.search(pattern, str(self.value)):
            raise AssertionError(f"pattern {pattern!r} not found in {str(self.value)!r}")
        return True

    @property
    def typename(self):
        """The exception's class name."""
        return self.type.__name__ if self.type else ""


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.pattern, self.info = expected, match, ExceptionInfo()

    def __enter__(self):
        return self.info

    def __exit__(self, et, ev, tb):
        if et is None:
            raise Failed(f"DID NOT RAISE {self.expected}")
        if not issubclass(et, self.expected):
            return False
        self.info.value, self.info.type, self.info.tb = ev, et, tb
        if self.pattern is not None:
            self.info.match(self.pattern)
        return True


def raises(expected, *args, match=None, **kwargs):
    """``pytest.raises`` (context manager or call form)."""
    if args:
        with _Raises(expected, match) as info:
            args[0](*args[1:], **kwargs)
        return info
    return _Raises(expected, match)


class _Warns:
    def __init__(self, expected, match=None):
        self.expected, self.pattern = expected, match

    def __enter__(self):
        self._cm = warnings.catch_warnings(record=True)
        self.list = self._cm.__enter__()
        warnings.simplefilter("always")
        return self.list

    def __exit__(self, et, ev, tb):
        self._cm.__exit__(et, ev, tb)
        if et is not None:
            return False
        for w in self.list:
            if issubclass(w.category, self.expected) and (
                    self.pattern is None or re.search(self.pattern, str(w.message))):
                return False
        raise Failed(f"DID NOT WARN {self.expected}")


def warns(expected=Warning, *args, match=None, **kwargs):
    """``pytest.warns`` (context manager or call form)."""
    if args:
        with _Warns(expected, match):
            return args[0](*args[1:], **kwargs)
    return _Warns(expected, match)


class _Approx:
    def __init__(self, expected, rel=None, abs=None):
        self.expected, self.rel, self.abs = expected, rel, abs

    def _close(self, a, b):
        if isinstance(b, (list, tuple)):
            return isinstance(a, (list, tuple)) and len(a) == len(b) and all(
                self._close(x, y) for x, y in zip(a, b))  # noqa: B905 - runs on py3.8+
        if isinstance(b, dict):
            return isinstance(a, dict) and a.keys() == b.keys() and all(
                self._close(a[k], b[k]) for k in b)
        try:
            if a == b:
                return True
            rel = 1e-6 if self.rel is None else self.rel
            tol = max(rel * abs(b), 1e-12 if self.abs is None else self.abs)
            return math.isfinite(b) and abs(a - b) <= tol
        except TypeError:
            return False

    def __eq__(self, other):
        return self._close(other, self.expected)

    def __repr__(self):
        return f"approx({self.expected!r})"


def approx(expected, rel=None, abs=None, nan_ok=False):
    """``pytest.approx`` for numbers and (nested) sequences or dicts of them."""
    return _Approx(expected, rel, abs)


def skip(reason="", **kwargs):
    """``pytest.skip``."""
    raise Skipped(reason)


def fail(reason="", pytrace=True):
    """``pytest.fail``."""
    raise Failed(reason)


def xfail(reason=""):
    """``pytest.xfail``."""
    raise XFailed(reason)


def importorskip(modname, minversion=None, reason=None):
    """``pytest.importorskip``."""
    try:
        return importlib.import_module(modname)
    except ImportError as e:
        raise Skipped(reason or f"could not import {modname!r}: {e}") from None


def fixture(fn=None, *, scope="function", params=None, autouse=False, ids=None, name=None):
    """``pytest.fixture`` (every scope is run as function scope)."""
    def mark(f):
        f._sao_fixture = {"params": list(params) if params is not None else None,
                          "autouse": autouse, "name": name or f.__name__, "ids": ids}
        return f
    return mark(fn) if fn is not None else mark


def _make_pytest_module():
    mod = types.ModuleType("pytest")
    mod.__doc__ = "A minimal pytest stand-in provided by the sandbox test runner."
    for name in ("raises", "warns", "approx", "skip", "fail", "xfail", "importorskip",
                 "fixture", "param"):
        setattr(mod, name, globals()[name])
    mod.mark = _MarkGenerator()
    mod.skip.Exception = Skipped
    mod.fail.Exception = Failed
    mod.ExceptionInfo, mod.MonkeyPatch = ExceptionInfo, MonkeyPatch
    mod.__sao_stand_in__ = True
    return mod


# ----- built-in fixtures -------------------------------------------------------------
_NOTSET = object()


class MonkeyPatch:
    """``monkeypatch``: attribute, item and environment patches undone after the test."""

    def __init__(self):
        self._undo = []

    def setattr(self, target, name, value=_NOTSET, raising=True):
        """Set an attribute (``target`` may be a dotted import path with ``value`` in name)."""
        if value is _NOTSET:
            module, _, attr = target.rpartition(".")
            target, name, value = importlib.import_module(module), attr, name
        old = getattr(target, name, _NOTSET)
        if old is _NOTSET and raising:
            raise AttributeError(f"{target!r} has no attribute {name!r}")
        if inspect.isclass(target):
            old = target.__dict__.get(name, _NOTSET)
        self._undo.append(lambda: delattr(target, name) if old is _NOTSET
                          else setattr(target, name, old))
        setattr(target, name, value)

    def delattr(self, target, name, raising=True):
        """Delete an attribute."""
        if not hasattr(target, name):
            if raising:
                raise AttributeError(name)
            return
        old = getattr(target, name)
        self._undo.append(lambda: setattr(target, name, old))
        delattr(target, name)

    def setitem(self, mapping, key, value):
        """Set a mapping item."""
        old = mapping.get(key, _NOTSET)
        self._undo.append(lambda: mapping.pop(key, None) if old is _NOTSET
                          else mapping.__setitem__(key, old))
        mapping[key] = value

    def delitem(self, mapping, key, raising=True):
        """Delete a mapping item."""
        if key not in mapping:
            if raising:
                raise KeyError(key)
            return
        old = mapping[key]
        self._undo.append(lambda: mapping.__setitem__(key, old))
        del mapping[key]

    def setenv(self, name, value, prepend=None):
        """Set an environment variable."""
        value = str(value)
        if prepend and name in os.environ:
            value = value + prepend + os.environ[name]
        self.setitem(os.environ, name, value)

    def delenv(self, name, raising=True):
        """Delete an environment variable."""
        self.delitem(os.environ, name, raising)

    def syspath_prepend(self, path):
        """Prepend to ``sys.path``."""
        self._undo.append(lambda: sys.path.remove(str(path)))
        sys.path.insert(0, str(path))

    def chdir(self, path):
        """Change the working directory."""
        old = os.getcwd()
        self._undo.append(lambda: os.chdir(old))
        os.chdir(path)

    def undo(self):
        """Undo every patch, newest first."""
        while self._undo:
            self._undo.pop()()


class _CaptureResult(tuple):
    @property
    def out(self):
        return self[0]

    @property
    def err(self):
        return self[1]


class CaptureFixture:
    """``capsys``: reads what the test wrote to stdout/stderr."""

    def readouterr(self):
        """Text written since the last call."""
        out, err = sys.stdout, sys.stderr
        result = _CaptureResult((out.getvalue(), err.getvalue()))
        out.seek(0)
        out.truncate()
        err.seek(0)
        err.truncate()
        return result


class FixtureRequest:
    """``request``: ``param`` of a parametrized fixture, ``getfixturevalue``."""

    def __init__(self, resolver, node_name):
        self._resolver, self.node_name = resolver, node_name
        self.param = None

    def getfixturevalue(self, name):
        """Resolve a fixture by name."""
        return self._resolver(name)


# ----- collection ----------------------------------------------------------------------
class Item:
    """One test to run."""

    def __init__(self, nodeid, kind, obj, cls=None, params=None, marks=(), fixture_params=None,
                 name=None):
        self.nodeid, self.kind, self.obj, self.cls = nodeid, kind, obj, cls
        self.name = name or getattr(obj, "__name__", str(obj))
        self.params = params or {}
        self.marks = list(marks)
        self.fixture_params = fixture_params or {}


def _marks_of(*objs):
    marks = []
    for obj in objs:
        found = getattr(obj, "pytestmark", [])
        marks.extend(found if isinstance(found, list) else [found])
    return [m for m in marks if isinstance(m, _Mark)]


def _idval(value, argname, index):
    if isinstance(value, str):
        text = value.encode("unicode_escape").decode("ascii")
        return text
    if value is None or isinstance(value, (bool, int, float, complex)):
        return str(value)
    if isinstance(value, re.Pattern):
        return value.pattern.encode("unicode_escape").decode("ascii")
    if inspect.isclass(value) or inspect.isfunction(value):
        return getattr(value, "__name__", f"{argname}{index}")
    return f"{argname}{index}"


def _parametrize_sets(marks):
    """Expand ``parametrize`` marks into (id, params, marks) combinations."""
    layers = []
    for mark in [m for m in marks if m.name == "parametrize"]:  # innermost decorator first
        argnames = mark.args[0] if mark.args else mark.kwargs["argnames"]
        argvalues = mark.args[1] if len(mark.args) > 1 else mark.kwargs["argvalues"]
        names = ([n.strip() for n in argnames.split(",") if n.strip()]
                 if isinstance(argnames, str) else list(argnames))
        if isinstance(argvalues, (set, frozenset)):
            # Sets iterate in an order that can change from run to run (hash(None) is an
            # address before Python 3.12): order them so that index-based ids are stable.
            argvalues = sorted(argvalues, key=repr)
        ids = mark.kwargs.get("ids")
        if ids is not None and not callable(ids):
            ids = list(ids)
        layer = []
        for index, value in enumerate(argvalues):
            extra, pid = [], None
            if isinstance(value, _Param):
                extra, pid, values = value.marks, value.id, tuple(value.values)
            elif len(names) == 1:
                values = (value,)
            else:
                values = tuple(value)
            if pid is None and ids is not None:
                pid = ids(values[0] if len(values) == 1 else values) if callable(ids) \
                    else (ids[index] if index < len(ids) else None)
            if pid is None:
                pid = "-".join(_idval(v, n, index)
                               for n, v in zip(names, values))  # noqa: B905 - py3.8+
            layer.append((str(pid), dict(zip(names, values)), extra))  # noqa: B905
        layers.append(_dedupe(layer))
    combos = []
    for product in itertools.product(*layers):
        ids = "-".join(p[0] for p in product)
        params, extra = {}, []
        for _, p, m in product:
            params.update(p)
            extra.extend(m)
        combos.append((ids, params, extra))
    return combos


def _dedupe(layer):
    counts = {}
    for pid, _, _ in layer:
        counts[pid] = counts.get(pid, 0) + 1
    seen, out = {}, []
    for pid, params, marks in layer:
        if counts[pid] > 1:
            n = seen.get(pid, 0)
            seen[pid] = n + 1
            pid = f"{pid}{n}"
        out.append((pid, params, marks))
    return out


class Collector:
    """Imports test files and lists their tests."""

    def __init__(self, root, conftest):
        self.root, self.conftest = root, conftest
        self.fixtures_by_file = {}

    def _import_path(self, relpath):
        path = os.path.join(self.root, relpath)
        directory = os.path.dirname(path)
        parts = [os.path.splitext(os.path.basename(path))[0]]
        base = directory
        while os.path.isfile(os.path.join(base, "__init__.py")):
            parts.insert(0, os.path.basename(base))
            base = os.path.dirname(base)
        if base not in sys.path:
            sys.path.insert(0, base)
        name = ".".join(parts)
        module = sys.modules.get(name)
        if module is not None and os.path.abspath(getattr(module, "__file__", "") or "") \
                == os.path.abspath(path):
            return module
        return importlib.import_module(name)

    def _conftests(self, relpath):
        allowed = self.conftest
        found = []
        directory = os.path.dirname(relpath)
        chain = []
        while True:
            chain.insert(0, os.path.join(directory, "conftest.py") if directory else "conftest.py")
            if not directory:
                break
            directory = os.path.dirname(directory)
        for rel in chain:
            if allowed is not True and rel not in (allowed or ()):
                continue
            if os.path.isfile(os.path.join(self.root, rel)):
                found.append(self._import_path(rel))
        return found

    def fixtures(self, relpath, module):
        """Fixture functions visible from a test file (conftests, then the module)."""
        table = {}
        for mod in [*self._conftests(relpath), module]:
            for obj in vars(mod).values():
                info = getattr(obj, "_sao_fixture", None)
                if info is not None:
                    table[info["name"]] = obj
        return table

    def collect(self, relpath):
        """The items of one test file (raises on import errors)."""
        module = self._import_path(relpath)
        fixtures = self.fixtures(relpath, module)
        self.fixtures_by_file[relpath] = fixtures
        items = []
        for name, obj in list(vars(module).items()):
            if inspect.isclass(obj):
                if issubclass(obj, unittest.TestCase):
                    if getattr(obj, "__test__", True) is False:
                        continue
                    for meth in unittest.TestLoader().getTestCaseNames(obj):
                        items.append(Item(f"{relpath}::{name}::{meth}", "unittest", meth, obj))
                elif name.startswith("Test") and "__init__" not in vars(obj) \
                        and getattr(obj, "__test__", True) is not False:
                    for meth_name in dir(obj):
                        meth = getattr(obj, meth_name, None)
                        if meth_name.startswith("test") and callable(meth):
                            items += self._function_items(
                                f"{relpath}::{name}::{meth_name}", meth, fixtures, obj,
                                meth_name)
            elif name.startswith("test") and inspect.isfunction(obj) \
                    and getattr(obj, "__test__", True) is not False \
                    and getattr(obj, "_sao_fixture", None) is None:
                items += self._function_items(f"{relpath}::{name}", obj, fixtures, None)
        return items

    def _function_items(self, base, fn, fixtures, cls, name=None):
        marks = _marks_of(cls, fn) if cls is not None else _marks_of(fn)
        combos = _parametrize_sets(marks) or [("", {}, [])]
        fparams = self._fixture_param_sets(fn, fixtures, {k for _, p, _ in combos for k in p})
        items = []
        for pid, params, extra in combos:
            for fid, fvals in fparams:
                ident = "-".join(x for x in (pid, fid) if x)
                nodeid = f"{base}[{ident}]" if ident else base
                items.append(Item(nodeid, "function", fn, cls, params, marks + extra, fvals,
                                  name))
        return items

    def _fixture_param_sets(self, fn, fixtures, given):
        """Parametrized fixtures the test depends on, expanded."""
        names, seen = [], set()

        def visit(name):
            if name in seen or name in given or name not in fixtures:
                return
            seen.add(name)
            for dep in _argnames(fixtures[name]):
                visit(dep)
            names.append(name)

        for arg in _argnames(fn):
            visit(arg)
        for name, f in fixtures.items():
            if f._sao_fixture["autouse"]:
                visit(name)
        layers = []
        for name in names:
            info = fixtures[name]._sao_fixture
            if info["params"] is None:
                continue
            ids = info["ids"]
            layer = []
            for i, p in enumerate(info["params"]):
                pid = (ids[i] if isinstance(ids, (list, tuple)) else
                       ids(p) if callable(ids) else _idval(p, name, i))
                layer.append((str(pid), {name: p}, []))
            layers.append(_dedupe(layer))
        if not layers:
            return [("", {})]
        out = []
        for product in itertools.product(*layers):
            vals = {}
            for _, v, _ in product:
                vals.update(v)
            out.append(("-".join(p[0] for p in product), vals))
        return out


def _argnames(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("self", "cls")]


# ----- running -------------------------------------------------------------------------
def _short(text):
    text = text.strip()
    return text if len(text) <= MESSAGE_LIMIT else "..." + text[-MESSAGE_LIMIT:]


def _format_exc(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == RUNNER_FILE:
        tb = tb.tb_next  # hide the runner's own frames
    lines = traceback.format_exception(type(exc), exc, tb)
    return _short("".join(lines))


def _on_alarm(signum, frame):
    raise TestTimeout("test timed out")


class Runner:
    """Runs items one at a time and reports outcomes."""

    def __init__(self, collector, timeout, emit):
        self.collector, self.timeout, self.emit = collector, timeout, emit

    def run(self, item, relpath):
        """Run one item and emit its outcome."""
        start = time.monotonic()
        out, err = io.StringIO(), io.StringIO()
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        old_cwd = os.getcwd()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.timeout)
        try:
            if item.kind == "unittest":
                outcome, message = self._run_unittest(item)
            else:
                outcome, message = self._run_function(item, relpath)
        except TestTimeout:
            outcome, message = "failed", f"timed out after {self.timeout} s"
        except BaseException as e:  # noqa: BLE001 - a test may raise anything
            if isinstance(e, KeyboardInterrupt):
                raise
            outcome, message = "error", _format_exc(e)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = old_out, old_err
            with contextlib.suppress(OSError):
                os.chdir(old_cwd)
        if outcome in ("failed", "error"):
            captured = out.getvalue()[-500:] + err.getvalue()[-500:]
            if captured.strip():
                message = f"{message}\n--- captured output ---\n{captured.strip()}"
        self.emit({"id": item.nodeid, "outcome": outcome, "message": _short(message or ""),
                   "duration": round(time.monotonic() - start, 4)})

    def _run_unittest(self, item):
        result = unittest.TestResult()
        item.cls(item.obj).run(result)
        if result.errors:  # an exception in the test: pytest reports it as failed
            return "failed", _short(result.errors[0][1])
        if result.failures:
            return "failed", _short(result.failures[0][1])
        if result.expectedFailures:
            return "xfailed", ""
        if result.unexpectedSuccesses:
            return "failed", "unexpected success"
        if result.skipped:
            return "skipped", result.skipped[0][1]
        return "passed", ""

    def _run_function(self, item, relpath):
        for mark in item.marks:
            if mark.name == "skip":
                return "skipped", mark.kwargs.get("reason", mark.args[0] if mark.args else "")
            if mark.name == "skipif":
                cond = mark.args[0] if mark.args else mark.kwargs.get("condition", True)
                if isinstance(cond, str):
                    cond = eval(cond, vars(sys.modules.get(item.obj.__module__, sys)))  # noqa: S307
                if cond:
                    return "skipped", mark.kwargs.get("reason", "")
        xfail_mark = next((m for m in item.marks if m.name == "xfail"), None)
        if xfail_mark is not None and xfail_mark.args and not xfail_mark.args[0]:
            xfail_mark = None
        instance = item.cls() if item.cls is not None else None
        fn = getattr(instance, item.name) if instance is not None else item.obj
        fixtures = self.collector.fixtures_by_file.get(relpath, {})
        finalizers, cache = [], {}
        mp = MonkeyPatch()
        tmpdirs = []
        try:
            if instance is not None and hasattr(instance, "setup_method"):
                instance.setup_method(fn)
            module = sys.modules.get(item.obj.__module__)
            if instance is None and module is not None and hasattr(module, "setup_function"):
                module.setup_function(fn)

            def resolve(name):
                if name in cache:
                    return cache[name]
                if name in item.params:
                    value = item.params[name]
                elif name == "monkeypatch":
                    value = mp
                elif name == "tmp_path":
                    import pathlib
                    tmpdirs.append(tempfile.mkdtemp(prefix="sao-test-"))
                    value = pathlib.Path(tmpdirs[-1])
                elif name == "tmpdir":
                    tmpdirs.append(tempfile.mkdtemp(prefix="sao-test-"))
                    value = tmpdirs[-1]
                elif name == "capsys":
                    value = CaptureFixture()
                elif name == "request":
                    value = FixtureRequest(resolve, item.nodeid)
                elif name in fixtures:
                    fx = fixtures[name]
                    request = FixtureRequest(resolve, item.nodeid)
                    request.param = item.fixture_params.get(name)
                    kwargs = {}
                    for arg in _argnames(fx):
                        kwargs[arg] = request if arg == "request" else resolve(arg)
                    value = fx(**kwargs)
                    if inspect.isgenerator(value):
                        gen = value
                        value = next(gen)
                        finalizers.append(gen)
                else:
                    raise LookupError(f"fixture {name!r} not found")
                cache[name] = value
                return value

            for name, fx in fixtures.items():
                if fx._sao_fixture["autouse"]:
                    resolve(name)
            for mark in item.marks:
                if mark.name == "usefixtures":
                    for name in mark.args:
                        resolve(name)
            kwargs = {name: resolve(name) for name in _argnames(fn)}
            try:
                fn(**kwargs)
            except Skipped as e:
                return "skipped", str(e)
            except XFailed as e:
                return "xfailed", str(e)
            except BaseException as e:  # noqa: BLE001 - SystemExit too, like pytest
                if isinstance(e, (KeyboardInterrupt, TestTimeout)):
                    raise
                if xfail_mark is not None:
                    raises_ = xfail_mark.kwargs.get("raises")
                    if raises_ is None or isinstance(e, raises_):
                        return "xfailed", ""
                return "failed", _format_exc(e)
            if xfail_mark is not None:
                if xfail_mark.kwargs.get("strict"):
                    return "failed", "[XPASS(strict)]"
                return "xpassed", ""
            return "passed", ""
        except Skipped as e:
            return "skipped", str(e)
        finally:
            for gen in reversed(finalizers):
                with contextlib.suppress(StopIteration, Exception):
                    next(gen)
            mp.undo()
            if instance is not None and hasattr(instance, "teardown_method"):
                with contextlib.suppress(Exception):
                    instance.teardown_method(fn)
            for d in tmpdirs:
                shutil.rmtree(d, ignore_errors=True)


def _remove_bytecode(root):
    """Delete ``__pycache__`` under root: a stale or planted ``.pyc`` is never imported.

    (A source edited within the same second, keeping its size, would otherwise
    be shadowed by its old bytecode.)
    """
    for path, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        if "__pycache__" in dirs:
            dirs.remove("__pycache__")
            shutil.rmtree(os.path.join(path, "__pycache__"), ignore_errors=True)


def main():
    """Read the spec from stdin, run the tests, print JSON lines."""
    spec = json.loads(sys.stdin.read())
    sys.dont_write_bytecode = True
    sys.stdin = open(os.devnull)  # noqa: SIM115 - tests must not block on stdin
    nonce = spec["nonce"]
    real_out = sys.stdout

    def emit(record):
        real_out.write(f"{nonce} {json.dumps(record)}\n")
        real_out.flush()

    root = os.path.abspath(spec["root"])
    # Always the stand-in, installed before the repository is on sys.path: grading is the
    # same whether or not the sandbox has pytest, and a planted pytest.py cannot replace it.
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    sys.modules["pytest"] = _make_pytest_module()
    _remove_bytecode(root)
    os.chdir(root)
    for path in (os.path.join(root, "src"), root):
        if os.path.isdir(path) and path not in sys.path:
            sys.path.insert(0, path)
    warnings.simplefilter("ignore")
    select = set(spec["select"]) if spec.get("select") else None
    collector = Collector(root, spec.get("conftest", True))
    runner = Runner(collector, float(spec.get("timeout", 10)), emit)
    for relpath in spec["targets"]:
        if not os.path.isfile(os.path.join(root, relpath)):
            emit({"id": relpath, "outcome": "error", "message": "test file not found",
                  "collect": True})
            continue
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, float(spec.get("timeout", 10)))
        try:
            items = collector.collect(relpath)
        except BaseException as e:  # noqa: BLE001 - a broken test module
            if isinstance(e, KeyboardInterrupt):
                raise
            items = None
            message = _format_exc(e)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = old_out, old_err
        if items is None:
            emit({"id": relpath, "outcome": "error", "message": message, "collect": True})
            continue
        for item in items:
            if select is None or item.nodeid in select:
                runner.run(item, relpath)
    emit({"done": True})


if __name__ == "__main__":
    main()
