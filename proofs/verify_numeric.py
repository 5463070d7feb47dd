"""The numeric path: random larger instances of a rule, both sides run by the float64
reference interpreter (`kernelsat.interp`) and compared.

Instances come from the same generator as bounded verification
(`proofs.verify_bounded.instances`) with random choices and larger bounds, so the
side conditions are decided by the same evaluator (`check_condition`); a constant
variable gets a random multiple of 1/8 that is none of the numbers the rule writes.
A rule passes a trial when both sides have the same shape and agree to a relative
1e-7 (`NaN` on both sides counts as agreement: both undefined). Wide trials
(`wide_check`) draw their own size bound, unbounded, from a seed nobody chooses.

>>> from kernelsat.rewrites.rule import parse_rule
>>> numeric_check(parse_rule("bad: (Sum ?a (exp ?x)) => (exp (Sum ?a ?x)) [r]"), seed=0) is not None
True
"""

from __future__ import annotations

import math
import random
import secrets

import numpy as np

from kernelsat.gather import label_bounds
from kernelsat.interp import evaluate_as
from kernelsat.ir import Term, input_dims, inputs, postorder
from kernelsat.proofs.verify_bounded import Bounds, Choices, Instance, instances
from kernelsat.rewrites.rule import Rule, RuleError

NUMERIC_BOUNDS = Bounds(size=7, split=16, extra=(("k", 3), ("j", 2)))
"""Larger than the proof bounds: sizes up to 7, split axes up to 16, two extra axes."""

WIDE_TRIALS = 6
WIDE_MEAN = 24.0
"""Wide trials: each draws its own size bound `8 + Exp(mean 24)`, unbounded, from a
seed nobody chooses (`secrets`), so no fixed bound exists to step over."""

MAX_ELEMENTS = 1 << 18
"""An instance whose largest tensor is bigger than this is drawn again."""

RTOL, ATOL = 1e-7, 1e-9


def largest_tensor(*terms: Term) -> int:
    """The number of entries of the largest intermediate tensor of `terms`."""
    out = 1
    for t in terms:
        for node in postorder(t):
            out = max(out, math.prod(node.shape.values()))
    return out


def random_instance(rule: Rule, rng: random.Random, bounds: Bounds = NUMERIC_BOUNDS,
                    attempts: int = 50) -> Instance | None:
    """One random instance of `rule` whose right side is well formed (and not too large
    to evaluate), or None."""
    for _ in range(attempts):
        for inst in instances(rule, Choices(rng, bounds)):
            if inst.rhs is not None and largest_tensor(inst.lhs, inst.rhs) <= MAX_ELEMENTS:
                return inst
    return None


def wide_bounds(rng: random.Random) -> Bounds:
    """A size bound of its own for one wide trial (see `WIDE_MEAN`)."""
    top = 8 + int(rng.expovariate(1 / WIDE_MEAN))
    return Bounds(size=top, split=2 * top, extra=(("k", 2),))


def random_env(terms: list[Term], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard-normal values for every input of `terms`; a gather's labels (an integer
    input) uniform over the range every axis it indexes allows (a rule over gathers
    holds for labels in range, which generated code checks at run time)."""
    env: dict[str, np.ndarray] = {}
    bounds: dict[str, int] = {}
    for t in terms:
        for name, bound in label_bounds(t).items():
            bounds[name] = min(bounds.get(name, bound), bound)
    for t in terms:
        for name, node in inputs(t).items():
            dims = input_dims(node)
            env.setdefault(name, rng.integers(0, bounds[name], dims).astype(np.float64)
                           if name in bounds else rng.standard_normal(dims))
    return env


def compare(inst: Instance, seed: int) -> str | None:
    """Run one instance; a description of the mismatch, or None when the sides agree."""
    assert inst.rhs is not None
    if dict(inst.lhs.shape) != dict(inst.rhs.shape):
        return (f"shape: {inst.describe()}: left {dict(inst.lhs.shape)}, "
                f"right {dict(inst.rhs.shape)}")
    env = random_env([inst.lhs, inst.rhs], np.random.default_rng(seed))
    order = tuple(inst.lhs.shape)
    left = evaluate_as(inst.lhs, env, order)
    right = evaluate_as(inst.rhs, env, order)
    close = np.isclose(left, right, rtol=RTOL, atol=ATOL, equal_nan=True)
    if bool(np.all(close)):
        return None
    where = np.unravel_index(int(np.argmin(close)), close.shape) if close.ndim else ()
    at = ", ".join(f"{a}={i}" for a, i in zip(order, where, strict=True))
    return (f"numeric: {inst.describe()}; at [{at}] the left side is {left[where]:.6g}, "
            f"the right side {right[where]:.6g} (inputs standard normal, seed {seed})")


def numeric_check(rule: Rule, seed: int = 0, trials: int = 8,
                  bounds: Bounds | None = NUMERIC_BOUNDS) -> str | None:
    """`trials` random instances; the first mismatch found, or None. `bounds=None`: wide
    trials, each with its own random size bound (`wide_bounds`)."""
    rng = random.Random(seed)
    for t in range(trials):
        try:
            inst = random_instance(rule, rng, bounds or wide_bounds(rng))
        except RuleError:
            return None
        if inst is None:
            continue
        why = compare(inst, seed * 1000 + t)
        if why is not None:
            return why if bounds else f"{why}; wide trial {t}, seed {seed}"
    return None


def wide_check(rule: Rule, trials: int = WIDE_TRIALS, seed: int | None = None) -> str | None:
    """Wide trials from an unpredictable seed (reported with any mismatch)."""
    return numeric_check(rule, secrets.randbits(32) if seed is None else seed, trials, None)
