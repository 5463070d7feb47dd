#!/usr/bin/env bash
# The peer benchmark from a fresh clone: makes .venv as bin/kernelsat does (bin/_setup.sh),
# then runs bench/peers.py, which makes .venv-torch when it is missing. Arguments go to
# bench/peers.py (--only, -p K=V, --quick, --no-extra, --out ...).
source "$(dirname "${BASH_SOURCE[0]}")/../bin/_setup.sh"
exec "$VENV/bin/python" "$ROOT/bench/peers.py" "$@"
