"""Who wins a duel of two programs timed interleaved: a paired, distribution-free verdict.

The final gate (`kernelsat.driver.pipeline.final_gate`) times the search's winner and
the eager program in rounds (`kernelsat.hardware.measure.measure_interleaved`: one run
of each per round, the order alternating). Comparing the two medians alone lets noise
decide a close call: on a loaded machine a burst that lands on a few of one side's runs
moves its median, and a 0.7x "win" shipped so. Here the unit of evidence is the *pair*:
round i's ratio r_i = winner_i / eager_i, two runs taken moments apart, so a slow
drift of the machine lands on both and cancels. The verdict is about the median of
those ratios, with a distribution-free confidence bound (the sign test's order
statistics: no normality, no equal spread assumed):

- **faster**: with confidence `CONFIDENCE`, the median pair ratio is below
  1 - `MIN_GAIN` (the winner is at least 1% faster in most rounds);
- **slower**: with the same confidence it is above 1;
- **tie**: neither. A tie is not a win: the eager program ships (the safe choice).

Under load (`Load.loaded`: the load probe `LOADED_FACTOR` x the best recorded on this
machine, a load average above `BUSY_LOAD` per core, or either side's runs spread by
more than `NOISY_SPREAD` of their median) the confidence asked is `LOADED_CONFIDENCE`,
and while the rounds cannot decide, they are extended (`TimingProtocol.extend`,
`settled`) before a tie is called.

>>> v = paired_verdict([1.0, 1.1, 0.9] * 10, [2.0, 2.1, 1.9] * 10)
>>> v.outcome, v.pairs, v.faster
('faster', 30, 30)
>>> paired_verdict([1.0, 2.0] * 10, [2.0, 1.0] * 10).outcome
'tie'
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from kernelsat.hardware.cache import LOADED_FACTOR

CONFIDENCE = 0.99
"""One-sided confidence of the bound on the median pair ratio, on a quiet machine."""

LOADED_CONFIDENCE = 0.999
"""The confidence asked when the machine looks loaded (`Load.loaded`)."""

MIN_GAIN = 0.01
"""A win must be at least this share faster (in the median pair): a smaller gain is a
tie, and the eager program ships."""

BUSY_LOAD = 1.5
"""A 1-minute load average above this many runnable threads per core says other work
shares the cores (kernelsat's own OpenMP team accounts for about one per core)."""

NOISY_SPREAD = 0.25
"""Runs whose interquartile range exceeds this share of their median are noisy."""


def _log_pmf(n: int, i: int) -> float:
    """log P(Binomial(n, 1/2) = i)."""
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)


def order_index(n: int, confidence: float) -> int:
    """The smallest j (1-based) with P(Binomial(n, 1/2) <= j - 1) >= `confidence`: the
    j-th smallest of n samples is then an upper bound on their median with that
    confidence (and the (n+1-j)-th a lower bound). n + 1 when n samples cannot give one.

    >>> order_index(10, 0.99), order_index(100, 0.99), order_index(3, 0.99)
    (10, 63, 4)
    """
    total = 0.0
    for j in range(1, n + 1):
        total += math.exp(_log_pmf(n, j - 1))
        if total >= confidence:
            return j
    return n + 1


@dataclass(frozen=True)
class Verdict:
    """The paired verdict on a duel (see the module docstring). Ratios are
    A's time / B's time per round: below 1, A is faster."""

    outcome: str  # "faster", "slower" or "tie" (A against B)
    pairs: int
    faster: int  # rounds in which A was faster
    ratio: float  # median pair ratio
    low: float  # lower confidence bound on it (0 when the pairs are too few)
    high: float  # upper confidence bound on it (inf when the pairs are too few)
    confidence: float

    def describe(self) -> str:
        """One phrase: "winner faster in 28 of 30 rounds, median pair ratio 0.81 (99%
        bound 0.84)"."""
        bound = self.high if self.outcome != "slower" else self.low
        shown = f"{bound:.2f}" if math.isfinite(bound) else "none: too few rounds"
        return (f"winner faster in {self.faster} of {self.pairs} rounds, median pair ratio "
                f"{self.ratio:.2f} ({self.confidence:.1%} bound {shown})")


def paired_verdict(a: Sequence[float], b: Sequence[float],
                   confidence: float = CONFIDENCE, min_gain: float = MIN_GAIN) -> Verdict:
    """The verdict on A against B from their runs in round order (`a[i]` and `b[i]` in
    the same round; a longer side's extra runs are not paired)."""
    pairs = sorted(x / y for x, y in zip(a, b, strict=False) if y > 0 and x >= 0)
    n = len(pairs)
    if n == 0:
        return Verdict("tie", 0, 0, math.nan, 0.0, math.inf, confidence)
    faster = sum(r < 1 for r in pairs)
    j = order_index(n, confidence)
    high = pairs[j - 1] if j <= n else math.inf
    low = pairs[n - j] if j <= n else 0.0
    ratio = (pairs[(n - 1) // 2] + pairs[n // 2]) / 2
    if high < 1 - min_gain:
        outcome = "faster"
    elif low > 1:
        outcome = "slower"
    else:
        outcome = "tie"
    return Verdict(outcome, n, faster, ratio, low, high, confidence)


def spread(times: Sequence[float]) -> float:
    """Interquartile range over median of a side's runs (0 for fewer than 4)."""
    if len(times) < 4:
        return 0.0
    s = sorted(times)
    n = len(s)
    med = (s[(n - 1) // 2] + s[n // 2]) / 2
    return (s[(3 * n) // 4] - s[n // 4]) / med if med > 0 else 0.0


def load_per_core() -> float:
    """The 1-minute load average per core (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return math.nan


@dataclass(frozen=True)
class Load:
    """What the duel saw of the machine: the load average per core (the larger of its
    start and end), the load probe taken with the rounds and the best recorded on this
    machine (NaN: unknown), and each side's spread."""

    per_core: float = math.nan
    probe: float = math.nan
    best_probe: float = math.nan
    spreads: tuple[float, ...] = ()

    @property
    def reasons(self) -> list[str]:
        """Why the machine looks loaded ([] when it does not)."""
        out = []
        if self.probe > LOADED_FACTOR * self.best_probe:  # False when either is NaN
            out.append(f"load probe {self.probe / self.best_probe:.1f}x the quietest")
        if self.per_core > BUSY_LOAD:
            out.append(f"load average {self.per_core:.1f} per core")
        noisy = [s for s in self.spreads if s > NOISY_SPREAD]
        if noisy:
            out.append(f"runs spread {max(noisy):.0%} of their median")
        return out

    @property
    def loaded(self) -> bool:
        return bool(self.reasons)

    @property
    def confidence(self) -> float:
        """The confidence a verdict asks under this load."""
        return LOADED_CONFIDENCE if self.loaded else CONFIDENCE


def judge(a: Sequence[float], b: Sequence[float], load: Load) -> Verdict:
    """`paired_verdict` at the confidence `load` asks (each side's spread added)."""
    seen = Load(load.per_core, load.probe, load.best_probe, (spread(a), spread(b)))
    return paired_verdict(a, b, seen.confidence)


def settled(times: Sequence[Sequence[float]]) -> bool:
    """Whether interleaved rounds of two programs (`times[0]`, `times[1]`) may stop:
    the verdict at the confidence the load asks now is not a tie. `measure_interleaved`
    asks this after its minimum rounds (`TimingProtocol.extend`)."""
    if len(times) != 2:
        return True
    return judge(times[0], times[1], Load(per_core=load_per_core())).outcome != "tie"


__all__ = [
    "BUSY_LOAD",
    "CONFIDENCE",
    "LOADED_CONFIDENCE",
    "LOADED_FACTOR",
    "MIN_GAIN",
    "NOISY_SPREAD",
    "Load",
    "Verdict",
    "judge",
    "load_per_core",
    "order_index",
    "paired_verdict",
    "settled",
    "spread",
]
