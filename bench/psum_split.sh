#!/usr/bin/env bash
# The psum split of an online pair (a one-pass column log-sum-exp: a running max per
# column, an array of sums rescaled to it), timed off and on, alternating, at two sizes:
# bench/programs/collse.ks at M=4096 (1 MB, in cache) and M=65536 (16 MB), N=64, the
# program `(LSE m (In X m:M n:64))` (written by the script at each size) through the C
# target, LLC flushed before every run, with the machine probe before and after. Makes .venv as bin/kernelsat does. Writes to
# stdout; bench/results/psum_split.md holds one run.
#     bench/psum_split.sh [ROUNDS]
source "$(dirname "${BASH_SOURCE[0]}")/../bin/_setup.sh"
rounds="${1:-4}"
ks="$VENV/bin/kernelsat"
spec="$ROOT/bench/programs/collse.ks"
prog="$(mktemp --suffix=.sexpr)"
trap 'rm -f "$prog"' EXIT
date -u
"$VENV/bin/python" "$ROOT/bench/machine.py" --quick | tail -1
for ((r = 1; r <= rounds; r++)); do
  for p in false true; do
    for size in 4096 65536; do
      echo "(LSE m (In X m:$size n:64))" > "$prog"  # the eager program at this size
      echo "== M=$size psum $p round $r"
      "$ks" bench "$spec" -p "M=$size" --program "$prog" \
        --knobs "[{\"psum\": $p}]" --min-runs 30 --min-seconds 0.5 --seed "$r" |
        grep -E "^total|rel\. L2"
    done
  done
done
"$VENV/bin/python" "$ROOT/bench/machine.py" --quick | tail -1
date -u
