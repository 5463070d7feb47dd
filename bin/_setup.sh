# Sourced by bin/kernelsat and bin/test: make .venv (Python >= 3.12) and install kernelsat into it.
# Re-installs when pyproject.toml changes. Prints what to install when no suitable Python exists.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

ks_python_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }

ks_find_python() {
  local c
  for c in python3.12 python3.13 python3.14 python3; do
    if command -v "$c" >/dev/null 2>&1 && ks_python_ok "$(command -v "$c")"; then
      command -v "$c"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    for c in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
      if [ -x "$c" ] && ks_python_ok "$c"; then echo "$c"; return 0; fi
    done
  fi
  return 1
}

if [ ! -x "$VENV/bin/python" ] || ! ks_python_ok "$VENV/bin/python"; then
  if ! PY="$(cd "$ROOT" && ks_find_python)"; then
    echo "kernelsat needs Python >= 3.12 (egglog 14 requires it) and found none." >&2
    echo "Install one, e.g. 'pyenv install 3.12' or your system's python3.12 package, then rerun." >&2
    exit 3
  fi
  echo "kernelsat: creating .venv with $PY ($("$PY" --version 2>&1))" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi

STAMP="$VENV/.kernelsat-installed"
WANT="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "kernelsat: installing dependencies into .venv (first use; a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev,distributed]" >&2
  echo "$WANT" > "$STAMP"
fi
