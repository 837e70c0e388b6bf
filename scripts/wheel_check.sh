#!/usr/bin/env bash
# The install path a user takes, checked: build rlcli's wheel, install it (not editable) into a fresh venv from
# the locks, then, from a folder outside the checkout, `rlcli --version`, `rlcli doctor` and a
# `rlcli serve start` / `rlcli serve stop` cycle on the embedded model. CI runs it (make wheel-check).
#   RLCLI_SERVER_VENV   the server venv to reuse (default ~/.rlcli/server-venv; built from the shipped lock if absent)
#   TORCH_INDEX         where the client's CPU torch comes from (default PyTorch's CPU index)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
work=$(mktemp -d)  # mode 0700
cleanup() { [ -x "$work/venv/bin/rlcli" ] && RLCLI_HOME="$work/home" "$work/venv/bin/rlcli" serve stop >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT
quiet() { "$@" 2> >(grep -v '^WARNING: Location' >&2); }

echo "wheel-check: building the wheel"
quiet "$PYTHON" -m pip wheel --quiet --no-deps -w "$work/dist" .
echo "wheel-check: $(cd "$work/dist" && ls) into a fresh venv, from env/torch-cpu.lock and env/client.lock"
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install --quiet --progress-bar off --require-hashes --no-deps)
quiet "${pip[@]}" --retries 0 --extra-index-url "$TORCH_INDEX" -r env/torch-cpu.lock
quiet "${pip[@]}" -r env/client.lock
quiet "$work/venv/bin/python" -m pip install --quiet --no-deps "$work"/dist/*.whl
"$work/venv/bin/python" -m pip check  # the wheel's own requirements are met by the lock

cd "$work"  # nothing of the checkout is importable from here
export RLCLI_HOME="$work/home" RLCLI_SERVER_VENV="${RLCLI_SERVER_VENV:-$HOME/.rlcli/server-venv}"
unset TINKER_BASE_URL
location=$(venv/bin/python -c 'import rlcli; print(rlcli.__file__)')
case "$location" in "$work"/venv/*) ;; *) echo "wheel-check: rlcli imported from $location, not the venv" >&2; exit 1;; esac
venv/bin/rlcli --version
port=$(venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
venv/bin/rlcli serve start --port "$port"
venv/bin/rlcli doctor
venv/bin/rlcli serve status
venv/bin/rlcli serve stop
echo "wheel-check: ok"
