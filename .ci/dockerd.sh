#!/usr/bin/env bash
# A Docker daemon for the test-suite (DockerSandbox), started and stopped by
# `make test`. It never changes host networking: no bridge, no iptables rules,
# no IP forwarding or masquerading (sandbox containers use network_mode=none).
#
#   .ci/dockerd.sh start          as root, when dockerd is installed and no
#                                 daemon answers: start one in the background
#                                 (own data root, log file) and wait for it
#   .ci/dockerd.sh build-image CMD...
#                                 as root with a daemon: run CMD (the image build)
#   .ci/dockerd.sh stop           remove leftover sandbox containers; stop the
#                                 daemon only if `start` started it (its pid
#                                 file), never one started some other way
#
# Not root, no dockerd, or SAO_GYM_DOCKER=0: every command is a no-op and the
# Docker tests skip.
set -uo pipefail

STATE_DIR=${SAO_GYM_DOCKERD_DIR:-/tmp/sao-gym-dockerd}
DATA_ROOT=${SAO_GYM_DOCKERD_DATA_ROOT:-/var/lib/sao-gym-docker}
TIMEOUT=${SAO_GYM_DOCKERD_TIMEOUT:-60}
PIDFILE=$STATE_DIR/dockerd.pid
LOG=$STATE_DIR/dockerd.log

say() { echo "dockerd.sh: $*" >&2; }
answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
usable() {
  [ "${SAO_GYM_DOCKER:-1}" != 0 ] || { say "SAO_GYM_DOCKER=0: Docker tests will skip"; return 1; }
  [ "$(id -u)" = 0 ] || { say "not root: not starting dockerd; Docker tests will skip"; return 1; }
  command -v dockerd >/dev/null && command -v docker >/dev/null \
    || { say "dockerd/docker not installed (apt-get install docker.io); Docker tests will skip"; return 1; }
}

start() {
  usable || return 0
  if answers; then
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      say "using the dockerd an earlier start left running (pid $(cat "$PIDFILE"))"
    else
      say "a Docker daemon is already running; using it (stop will leave it running)"
    fi
    return 0
  fi
  mkdir -p "$STATE_DIR" "$DATA_ROOT"
  say "starting dockerd (data root $DATA_ROOT, log $LOG)"
  # setsid: the daemon must not share make's process group (Ctrl-C, job control).
  setsid dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
    --data-root "$DATA_ROOT" --pidfile "$STATE_DIR/docker.pid" >"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  local pid waited=0
  pid=$(cat "$PIDFILE")
  until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      say "dockerd exited during start-up; last lines of $LOG:"; tail -n 20 "$LOG" >&2
      rm -f "$PIDFILE"
      say "set SAO_GYM_DOCKER=0 to run the tests without Docker"
      return 1
    fi
    if [ "$waited" -ge "$TIMEOUT" ]; then
      say "dockerd did not answer within ${TIMEOUT}s; last lines of $LOG:"; tail -n 20 "$LOG" >&2
      stop
      say "set SAO_GYM_DOCKER=0 to run the tests without Docker"
      return 1
    fi
    sleep 1; waited=$((waited + 1))
  done
  # dockerd's own pid file is authoritative (setsid may have forked).
  [ -s "$STATE_DIR/docker.pid" ] && cp "$STATE_DIR/docker.pid" "$PIDFILE" && pid=$(cat "$PIDFILE")
  say "dockerd is up (pid $pid, ${waited}s)"
}

build_image() {
  usable 2>/dev/null || return 0
  answers || { say "no Docker daemon: not building the sandbox image"; return 0; }
  "$@"
}

stop() {
  [ "$(id -u)" = 0 ] || return 0
  if command -v docker >/dev/null && answers; then
    local left
    left=$(docker ps -aq --filter label=sao_gym.sandbox=1)
    if [ -n "$left" ]; then
      say "WARNING: $(echo "$left" | wc -l) sandbox container(s) left behind; removing them"
      echo "$left" | xargs docker rm -f >/dev/null
    fi
  fi
  [ -f "$PIDFILE" ] || return 0
  local pid waited=0
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do
      if [ "$waited" = 30 ]; then say "dockerd ignored SIGTERM for 30s; killing it"; kill -KILL "$pid"; fi
      sleep 1; waited=$((waited + 1))
    done
  fi
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  build-image) shift; build_image "$@" ;;
  *) echo "usage: $0 start|stop|build-image CMD..." >&2; exit 2 ;;
esac
