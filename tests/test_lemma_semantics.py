"""The all-sizes method's symbolic semantics preserves values: a random tensor term
(sums, maxima, LSE, SoftmaxAvg, Dot, splits, elementwise ops) evaluated at a generic
index and put in canonical form by the lemma chain (`proofs.verify_lemmas.Context`),
then computed back at concrete sizes (every aggregate summed or maximized over its bound
indices), equals the float64 interpreter at every output index. Every lemma the
canonicalization applies is exercised here on random bodies."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import cast

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Dot,
    In,
    Max,
    ShapeError,
    SoftmaxAvg,
    Split,
    Sum,
    Term,
    add,
    exp,
    max_,
    mul,
    neg,
)
from kernelsat.proofs.normalize import Sym, const, normalize
from kernelsat.proofs.verify_lemmas import Context

INPUTS = [In("x", (("a", 4), ("b", 3))), In("y", (("a", 4),)), In("z", (("b", 3), ("k", 2))),
          In("w", (("a", 4), ("b", 3)))]
LEAVES = [*INPUTS[:3], exp(INPUTS[3])]
FUNCS = {"exp": math.exp, "log": math.log, "sqrt": math.sqrt, "tanh": math.tanh,
         "erf": math.erf}


def _safe(make: Callable[..., Term]) -> Callable[..., Term]:
    def run(*args: object) -> Term:
        try:
            return make(*args)
        except ShapeError:
            assume(False)
            raise

    return run


def _terms() -> st.SearchStrategy[Term]:
    def extend(children: st.SearchStrategy[Term]) -> st.SearchStrategy[Term]:
        def reduce(t: Term, op: int, pick: int) -> Term:
            axes = sorted(t.shape)
            assume(axes)
            axis = axes[pick % len(axes)]
            return [Sum, Max, LSE][op % 3](axis, t)

        def split(t: Term) -> Term:
            assume("a" in t.shape)
            return Split("a", 2, t)

        def pair(s: Term, v: Term, op: int, pick: int) -> Term:
            axes = sorted(set(s.shape) & set(v.shape))
            assume(axes)
            axis = axes[pick % len(axes)]
            return (SoftmaxAvg if op % 2 else Dot)(axis, s, v)

        return st.one_of(
            st.builds(_safe(add), children, children),
            st.builds(_safe(mul), children, children),
            st.builds(_safe(max_), children, children),
            children.map(_safe(neg)),
            children.map(_safe(split)),
            st.builds(_safe(reduce), children, st.integers(0, 2), st.integers(0, 5)),
            st.builds(_safe(pair), children, children, st.integers(0, 1), st.integers(0, 5)),
        )

    return st.recursive(st.sampled_from(LEAVES), extend, max_leaves=7)


def _index_value(expr: str, at: dict[str, int]) -> int:
    """An index expression (`(<a/o2>*2+{a/i2})`) at concrete index values."""
    text = re.sub(r"[<{][^<>{}()*+,]*[>}]", lambda m: str(at[m.group(0)]), expr)
    assert re.fullmatch(r"[0-9*+()]+", text), text
    return int(eval(text))  # digits, * and + only (checked)


class Concrete:
    """The reals a canonical expression denotes at concrete sizes and inputs."""

    def __init__(self, ctx: Context, sizes: dict[str, int], env: dict[str, np.ndarray]) -> None:
        self.ctx, self.sizes, self.env = ctx, sizes, env

    def size(self, name: str) -> int:
        if name.startswith("$n["):
            return self.sizes[name[3:-1]]
        axis, _, factor = name[3:-1].rpartition(",")
        return self.sizes[axis] // int(factor)  # $q[axis,F]

    def value(self, s: Sym, at: dict[str, int]) -> float:
        match s.op:
            case "const":
                return float(cast(Fraction, s.value))
            case "add":
                return math.fsum(self.value(a, at) for a in s.args)
            case "mul":
                return math.prod(self.value(a, at) for a in s.args)
            case "recip":
                return 1 / self.value(s.args[0], at)
            case "max" | "min":
                f = max if s.op == "max" else min
                return f(self.value(a, at) for a in s.args)
            case "fn":
                return FUNCS[str(s.value)](self.value(s.args[0], at))
            case "var":
                return self.var(str(s.value), at)
        raise AssertionError(s.op)

    def var(self, name: str, at: dict[str, int]) -> float:
        if name.startswith(("$n[", "$q[")):
            return float(self.size(name))
        agg = self.ctx.aggs.get(name)
        if agg is None:
            tensor, index, _ = self.ctx.entries[name]
            pos = tuple(_index_value(i, at) for i in index)
            return float(self.env[tensor][pos])
        binders = sorted(agg.binders)
        values = [self.value(agg.body, {**at, **dict(zip(binders, idx, strict=True))})
                  for idx in itertools.product(*(range(self.sizes[b[1:-1]]) for b in binders))]
        return math.fsum(values) if agg.kind == "sum" else max(values)


@settings(max_examples=150, deadline=None)
@given(term=_terms(), seed=st.integers(0, 2**16))
def test_canonical_aggregates_keep_the_value(term: Term, seed: int) -> None:
    try:
        sizes = dict(term.all_sizes)
    except ShapeError:
        assume(False)
    Sym.reset()
    rng = np.random.default_rng(seed)
    env = {str(x.attrs[0]): rng.standard_normal(list(x.shape.values())) for x in INPUTS}
    ctx = Context(factor_syms={2: const(2)})
    out = tuple(term.shape)
    dom: list[Sym] = []
    sym = normalize(ctx.value(term, {a: f"{{{a}}}" for a in out}, dom), frozenset(ctx.positive))
    expected = evaluate_as(term, env, out)
    concrete = Concrete(ctx, sizes, env)
    for idx in itertools.product(*(range(sizes[a]) for a in out)):
        at = {f"{{{a}}}": i for a, i in zip(out, idx, strict=True)}
        got = concrete.value(sym, at)
        want = float(expected[idx])
        assert math.isclose(got, want, rel_tol=1e-7, abs_tol=1e-9), (str(term), idx, got, want)
