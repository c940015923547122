"""The packages bugs are made from: a pure-Python package and its test suite, as text.

:func:`resolve_package` finds one by a shipped name (``data/bugs/NAME.jsonl.gz``),
a checkout or unpacked sdist directory (:func:`package_from_dir`), an sdist
archive (:func:`package_from_sdist`) or, last, ``pip download`` of an sdist.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao_gym.envs.code_repo.tasks import BUGS_DIR, read_jsonl

_KEEP_TOP = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)(\..*)?$|^README(\.\w+)?$|"
                       r"^(pyproject\.toml|setup\.cfg|setup\.py)$", re.I)
_MAX_FILE_BYTES = 300_000
_NOT_SOURCES = ("setup.py", "conftest.py", "noxfile.py", "tasks.py", "fabfile.py")
_TEST_DATA = (".py", ".txt", ".json", ".xml", ".toml", ".cfg", ".ini", ".csv", ".yaml", ".yml")


@dataclass(frozen=True)
class PackageSource:
    """A pure-Python package with its test suite, as text files."""

    name: str
    version: str
    license: str
    files: Mapping[str, str]
    test_files: tuple[str, ...]
    """``test_*.py`` files of the suite."""
    source_files: tuple[str, ...]
    """Modules that may be mutated."""
    test_dirs: tuple[str, ...] = ("tests",)

    def record(self, baseline_pass: Sequence[str]) -> dict[str, Any]:
        """The package record of a bug-task file."""
        return {"kind": "package", "name": self.name, "version": self.version,
                "license": self.license, "files": dict(self.files),
                "test_files": list(self.test_files), "test_dirs": list(self.test_dirs),
                "source_files": list(self.source_files),
                "baseline_pass": list(baseline_pass)}


def package_from_dir(root: str | Path, name: str | None = None,
                     version: str = "unknown") -> PackageSource:
    """Collect a package checkout or unpacked sdist: its modules, tests, license, README.

    The importable code is ``src/<pkg>/``, ``<pkg>/`` or ``<pkg>.py`` at the
    top; the tests are ``tests/`` (or ``test/``).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    meta = _sdist_metadata(root)
    name = name or meta.get("name") or root.name
    test_dir = next((d for d in ("tests", "test") if (root / d).is_dir()), None)
    if test_dir is None:
        raise ValueError(f"{root} has no tests/ or test/ directory")
    package_dirs = _package_dirs(root, test_dir)
    files: dict[str, str] = {}
    sources: list[str] = []
    tests: list[str] = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if not path.is_file() or path.stat().st_size > _MAX_FILE_BYTES or any(
                p.startswith(".") or p == "__pycache__" or p.endswith(".egg-info")
                for p in parts):
            continue
        rel, top = "/".join(parts), parts[0]
        if len(parts) == 1:
            if rel.endswith(".py") and rel not in _NOT_SOURCES:
                sources.append(rel)
            elif not _KEEP_TOP.match(rel) and rel != "conftest.py":
                continue
        elif top == test_dir:
            if path.suffix not in _TEST_DATA:
                continue
            if path.suffix == ".py" and (path.name.startswith("test_")
                                         or path.name.endswith("_test.py")):
                tests.append(rel)
        elif (top == "src" or top in package_dirs) and path.suffix == ".py":
            sources.append(rel)
        else:
            continue
        try:
            files[rel] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            sources = [s for s in sources if s != rel]
            tests = [t for t in tests if t != rel]
    if not sources:
        raise ValueError(f"{root}: no package modules found (src/<pkg>/, <pkg>/ or <pkg>.py)")
    if not tests:
        raise ValueError(f"{root}/{test_dir}: no test_*.py files")
    license_file = next((p for p in files if "/" not in p and p.upper().startswith(
        ("LICEN", "COPYING"))), None)
    return PackageSource(name=name, version=meta.get("version", version),
                         license=meta.get("license", license_file or "unknown"),
                         files=files, test_files=tuple(tests), source_files=tuple(sources),
                         test_dirs=(test_dir,))


def _package_dirs(root: Path, test_dir: str) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
            and p.name not in (test_dir, "src", "docs", "doc", "examples", "benchmarks")}


def _sdist_metadata(root: Path) -> dict[str, str]:
    """Name, version and license from an sdist's ``PKG-INFO`` headers."""
    pkg_info = root / "PKG-INFO"
    out: dict[str, str] = {}
    if not pkg_info.is_file():
        return out
    classifiers = []
    for line in pkg_info.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line:
            break  # end of the headers
        if line[:1].isspace():
            continue  # a continuation line
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("name", "version"):
            out[key] = value
        elif key == "license-expression":
            out["license"] = value
        elif key == "license" and value and len(value) < 40 and "license" not in out:
            out["license"] = value
        elif key == "classifier" and value.startswith("License ::"):
            classifiers.append(value.split("::")[-1].strip())
    if "license" not in out and classifiers:
        out["license"] = classifiers[0]
    return out


def package_from_sdist(archive: str | Path, name: str | None = None) -> PackageSource:
    """Collect a package from an sdist (``.tar.gz``)."""
    with tempfile.TemporaryDirectory(prefix="sao-sdist-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ValueError(f"{archive}: expected one top-level directory")
        return package_from_dir(tops[0], name)


def shipped_package(name: str) -> PackageSource | None:
    """A package shipped in ``data/bugs/`` (its package record), or None."""
    path = BUGS_DIR / f"{name}.jsonl.gz"
    if not path.is_file():
        return None
    rec = next(r for r in read_jsonl(path) if r.get("kind") == "package")
    return PackageSource(rec["name"], rec.get("version", "unknown"), rec.get("license", ""),
                         rec["files"], tuple(rec["test_files"]), tuple(rec["source_files"]),
                         tuple(rec.get("test_dirs", ["tests"])))


def resolve_package(spec: str) -> PackageSource:
    """A package from a shipped name, a directory, an sdist, or ``pip download``."""
    if (pkg := shipped_package(spec)) is not None:
        return pkg
    path = Path(spec)
    if path.is_dir():
        return package_from_dir(path)
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        return package_from_sdist(path)
    if "/" in spec or spec.startswith(".") or path.exists():
        raise ValueError(f"{spec!r} is neither a package directory nor an sdist (.tar.gz)")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.]+)?", spec):
        raise ValueError(f"{spec!r} is not a package name")
    with tempfile.TemporaryDirectory(prefix="sao-pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "-q", "-d", tmp, spec]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or not archives:
            raise ValueError(f"{spec!r} is not a shipped package, a directory or an sdist, and "
                             f"`pip download` found no sdist: {proc.stderr.strip()[-500:]}")
        return package_from_sdist(archives[0])
