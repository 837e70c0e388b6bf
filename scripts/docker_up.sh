#!/usr/bin/env bash
# Make a Docker daemon available for `rlcli train harbor` / `rlcli harbor run` and the docker tests.
#
#   scripts/docker_up.sh        (as root; `make docker` runs it; CI runs it before `make test`)
#
# Idempotent: installs docker.io and debootstrap from Debian's packages only when missing, starts
# dockerd in the background only when no daemon answers, then waits until `docker info` works.
# A machine that already runs Docker (Docker Desktop, a systemd service) is left as it is.
set -euo pipefail

LOG=${DOCKERD_LOG:-/var/log/rlcli-dockerd.log}
WAIT_S=${DOCKERD_WAIT_S:-60}

if docker info >/dev/null 2>&1; then
  echo "docker: a daemon is already running"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "docker_up: no Docker daemon answers and this is not root: start Docker (e.g. 'sudo systemctl start docker'," \
       "or rerun this script with sudo)" >&2
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  echo "docker: installing docker.io and debootstrap (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
fi

# A daemon may already be starting (another caller of this script): only start one if none runs.
if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "docker: starting dockerd (log: $LOG)"
  # setsid: the daemon must outlive this script and the shell that ran it (CI steps, make).
  setsid nohup dockerd >"$LOG" 2>&1 </dev/null &
fi

for _ in $(seq "$WAIT_S"); do
  if docker info >/dev/null 2>&1; then
    echo "docker: ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 1
done
echo "docker_up: dockerd did not answer within ${WAIT_S}s; see $LOG" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
