#!/usr/bin/env bash
# The knob-search benchmark from a fresh clone: makes .venv as bin/kernelsat does
# (bin/_setup.sh), then runs bench/knob_search.py, which writes
# bench/results/knob_search.md. Arguments go to bench/knob_search.py (--small, --only,
# --factor, --budget, --repeats, --out).
source "$(dirname "${BASH_SOURCE[0]}")/../bin/_setup.sh"
exec "$VENV/bin/python" "$ROOT/bench/knob_search.py" "$@"
