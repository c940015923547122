#!/usr/bin/env bash
# The light install, checked for real: in a venv without extras, `pip install .`
# installs no torch, transformers, tokenizers or matplotlib, and
# `sao_gym.make("sao_gym/Arithmetic-v0")` plus `sao-gym check
# sao_gym/Arithmetic-v0` work (and an env whose extra is missing, `sao-gym
# train` and `sao-gym plot` say which extra to install). Prints one line:
# `light install: PASS ...` or `light install: FAIL: ...` (then the tail of its
# log); exit 0 or 1.
#
#   .ci/light_install.sh [PYTHON]        (default: python3)
#
# The venv is a cache: $SAO_GYM_LIGHT_VENV, default
# ${XDG_CACHE_HOME:-~/.cache}/sao-gym/light-venv. It is made from scratch
# (python -m venv; pip install .) when pyproject.toml, this script or the
# Python changed; otherwise only sao-gym itself is reinstalled into it
# (pip install --no-deps --force-reinstall .), so the check sees today's code.
# Before a from-scratch install, a dry run refuses a resolution that would
# pull torch (an unpinned torch is a multi-GB CUDA download). It installs from
# a clean copy of the working tree: a stale build/ folder must not leak into it.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${1:-python3}
VENV=${SAO_GYM_LIGHT_VENV:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/sao-gym/light-venv}
HEAVY="torch transformers tokenizers matplotlib"
START=$(date +%s)
mkdir -p "$(dirname "$VENV")"
LOG=$(mktemp "${TMPDIR:-/tmp}/sao-gym-light-install.XXXXXX.log")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sao-gym-light-install.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "light install: FAIL: $* (log: $LOG)"
  tail -n 25 "$LOG" | sed 's/^/  | /'
  exit 1
}

# One checkout at a time per venv (several worktrees may share the cache).
exec 9>"$VENV.lock"
if command -v flock >/dev/null; then flock 9; fi

SRC=$WORK/src
mkdir -p "$SRC"
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
    --exclude=./runs --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache \
    --exclude=.ruff_cache -cf - . | tar -C "$SRC" -xf - || fail "copying the working tree"

KEY=$( { cat "$ROOT/pyproject.toml" "$0"; "$PYTHON" -c 'import sys; print(sys.version)'; } \
       | sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.sao-gym-key" 2>/dev/null)" = "$KEY" ]; then
  how="reused venv"
  "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$SRC" >>"$LOG" 2>&1 \
    || fail "pip install --no-deps --force-reinstall . into $VENV"
else
  how="fresh venv"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "$PYTHON -m venv $VENV"
  "$VENV/bin/python" -m pip install -q --dry-run --report "$WORK/report.json" "$SRC" \
    >>"$LOG" 2>&1 || fail "pip install --dry-run ."
  pulled=$("$VENV/bin/python" - "$WORK/report.json" "$HEAVY" <<'EOF'
import json, sys
names = {i["metadata"]["name"].lower() for i in json.load(open(sys.argv[1]))["install"]}
print(" ".join(sorted(names & set(sys.argv[2].split()))))
EOF
  ) || fail "reading pip's dry-run report"
  [ -z "$pulled" ] || { rm -rf "$VENV"; fail "pip install . (no extras) would install: $pulled"; }
  "$VENV/bin/python" -m pip install -q "$SRC" >>"$LOG" 2>&1 \
    || { rm -rf "$VENV"; fail "pip install . into a fresh venv"; }
  echo "$KEY" >"$VENV/.sao-gym-key"
fi
"$VENV/bin/python" -m pip check >>"$LOG" 2>&1 || fail "pip check"

# Run from a folder without sources: they must not shadow the installed package.
mkdir -p "$WORK/run" && cd "$WORK/run" || fail "cd $WORK/run"
"$VENV/bin/python" - "$VENV" "$HEAVY" >>"$LOG" 2>&1 <<'EOF' || fail "python checks (see log)"
import importlib.util, os, sys

venv, heavy = os.path.realpath(sys.argv[1]), sys.argv[2].split()
installed = [m for m in heavy if importlib.util.find_spec(m) is not None]
assert not installed, f"installed without extras: {installed}"
import sao_gym

assert os.path.realpath(sao_gym.__file__).startswith(venv), f"not the installed copy: {sao_gym.__file__}"
env = sao_gym.make("sao_gym/Arithmetic-v0")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step("hello")
env.close()
from sao_gym.registration import MissingExtra

try:
    sao_gym.make("sao_gym/MathTIR-v0")
except MissingExtra as e:
    assert "sao_gym/MathTIR-v0" in str(e) and "pip install 'sao-gym[envs]'" in str(e), str(e)
else:
    raise AssertionError("MathTIR-v0 was made without the envs extra")
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, f"imported: {loaded}"
print("python checks ok")
EOF
"$VENV/bin/sao-gym" check sao_gym/Arithmetic-v0 --episodes 2 >>"$LOG" 2>&1 \
  || fail "sao-gym check sao_gym/Arithmetic-v0"
# a command without its extra: one line naming it, exit code 2, no traceback
needs_extra() {  # EXTRA SAO-GYM-ARGS...
  local extra=$1 err rc
  shift
  err=$("$VENV/bin/sao-gym" "$@" 2>&1 >/dev/null) && rc=0 || rc=$?
  echo "sao-gym $* without the $extra extra: rc $rc: $err" >>"$LOG"
  [ "$rc" = 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] \
    && printf '%s' "$err" | grep -q "pip install 'sao-gym\[$extra\]'" \
    || fail "sao-gym $1 without the $extra extra must fail in one line naming the extra"
}
needs_extra train train --set total_steps=1
needs_extra train plot "$WORK/run"  # matplotlib is in the train extra

echo "light install: PASS (no extras: no ${HEAVY// //}; make + sao-gym check" \
     "sao_gym/Arithmetic-v0 ok; $how, $(( $(date +%s) - START )) s)"
rm -f "$LOG"
