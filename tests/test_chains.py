"""The rule library reaches fused, tiled forms from the specs' eager terms.

Each chain applies named library rules one at a time (`apply_at`) to the eager term
the spec parser builds, checks every intermediate against the float64 interpreter,
and lands exactly on the expected term.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    In,
    Max,
    SoftmaxAvg,
    Split,
    Store,
    Sum,
    Term,
    add,
    div,
    exp,
    mul,
    postorder,
    sqrt,
    sub,
)
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library
from kernelsat.rewrites.library import RuleSet
from kernelsat.rewrites.rule import Bindings, Direction, apply_at
from kernelsat.rewrites.rule import Path as TermPath

SPECS = Path(__file__).resolve().parent.parent / "specs"

Step = tuple[str, TermPath, Direction, Bindings]


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    return load_library(cache_dir=tmp_path_factory.getbasetemp() / "rule-cache")


def _env(term: Term, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    env = {}
    for node in postorder(term):
        if node.op is Op.IN:
            shape = tuple(s for dim in node.attrs[1] for _, s in dim)  # type: ignore[union-attr]
            env[str(node.attrs[0])] = rng.standard_normal(shape)
    return env


def run_chain(lib: RuleSet, term: Term, steps: list[Step]) -> Term:
    """Apply each step, checking every intermediate numerically against the first."""
    env = _env(term)
    axes = tuple(term.shape)
    reference = evaluate_as(term, env, axes)
    for name, path, direction, bindings in steps:
        term = apply_at(lib.by_name[name], term, path, direction, bindings)
        got = evaluate_as(term, env, axes)
        np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-12, err_msg=name)
    return term


def stores(term: Term) -> int:
    return sum(1 for n in postorder(term) if n.op is Op.STORE)


def _spec(name: str, params: dict[str, int]) -> Term | None:
    try:
        from kernelsat.spec import load_spec
    except ImportError:  # pragma: no cover - the spec parser is another stage
        return None
    return load_spec(SPECS / f"{name}.ks", params).term


# -- attention --------------------------------------------------------------------------

B, H, N, D = 1, 2, 8, 4


def attention_eager() -> Term:
    """The spec's attention: S and P stored, softmax as the stable macro."""
    q = In("Q", (("b", B), ("h", H), ("i", N), ("d", D)))
    k = In("K", (("b", B), ("h", H), ("n", N), ("d", D)))
    v = In("V", (("b", B), ("h", H), ("n", N), ("e", D)))
    s = Store(div(Sum("d", mul(q, k)), sqrt(Const(float(D)))))
    e = exp(sub(s, Max("n", s)))
    p = Store(div(e, Sum("n", e)))
    return Sum("n", mul(p, v))


def attention_tiled(f: int) -> Term:
    q = In("Q", (("b", B), ("h", H), ("i", N), ("d", D)))
    k = In("K", (("b", B), ("h", H), ("n", N), ("d", D)))
    v = In("V", (("b", B), ("h", H), ("n", N), ("e", D)))
    s = div(Sum("d", mul(q, Split("n", f, k))), sqrt(Const(float(D))))
    return SoftmaxAvg(f"n/o{f}", LSE(f"n/i{f}", s), SoftmaxAvg(f"n/i{f}", s, Split("n", f, v)))


def test_attention_spec_matches_the_eager_term() -> None:
    spec = _spec("attention", {"B": B, "H": H, "N": N, "D": D})
    if spec is None:
        pytest.skip("no spec parser")
    assert spec is attention_eager()


def test_attention_reaches_the_tiled_single_kernel_form(library: RuleSet) -> None:
    f = 4
    steps: list[Step] = [
        ("store-drop-div", (0, 0), "forward", {}),  # fuse P into the weighted sum
        ("mul-div-comm", (0,), "forward", {}),  # (E / Z) * V = (E * V) / Z
        ("sum-hoist-div", (), "forward", {}),  # Z is free of n
        ("softmaxavg-def-stable", (), "backward", {}),  # recognize SoftmaxAvg_n(S, V)
        ("store-drop-div", (0,), "forward", {}),  # fuse S
        ("softmaxavg-split", (), "forward", {"f": f}),  # the online split identity
        # Split(n) of S pushed onto K, in the LSE's copy and in the SoftmaxAvg's copy
        ("split-div-left", (0, 0), "forward", {}),
        ("split-past-sum", (0, 0, 0), "forward", {}),
        ("split-mul-right", (0, 0, 0, 0), "forward", {}),
        ("split-div-left", (1, 0), "forward", {}),
        ("split-past-sum", (1, 0, 0), "forward", {}),
        ("split-mul-right", (1, 0, 0, 0), "forward", {}),
    ]
    out = run_chain(library, attention_eager(), steps)
    assert stores(out) == 0
    assert out is attention_tiled(f)


# -- softmax ------------------------------------------------------------------------------

M = 4


def softmax_eager() -> Term:
    x = In("X", (("i", M), ("n", N)))
    e = exp(sub(x, Max("n", x)))
    return div(e, Sum("n", e))


def test_softmax_spec_matches_the_eager_term() -> None:
    spec = _spec("softmax", {"M": M, "N": N})
    if spec is None:
        pytest.skip("no spec parser")
    assert spec is softmax_eager()


def test_softmax_reaches_the_online_tiled_form(library: RuleSet) -> None:
    steps: list[Step] = [
        ("exp-log", (1,), "backward", {}),  # Z = exp(log Z), Z > 0
        ("exp-sub", (), "backward", {}),  # exp(a) / exp(b) = exp(a - b)
        ("sub-sub", (0,), "forward", {}),  # (x - m) - log Z = x - (m + log Z)
        ("lse-def-stable", (0, 1), "backward", {}),  # m + log sum exp(x - m) = LSE x
        ("lse-split", (0, 1), "forward", {"f": 4}),
    ]
    out = run_chain(library, softmax_eager(), steps)
    x = In("X", (("i", M), ("n", N)))
    assert out is exp(sub(x, LSE("n/o4", LSE("n/i4", Split("n", 4, x)))))
    assert stores(out) == 0


# -- layernorm and rmsnorm ------------------------------------------------------------------


def layernorm_eager(eps: float = 1e-5) -> Term:
    x = In("X", (("i", M), ("n", N)))
    g, bias = In("G", (("n", N),)), In("Bias", (("n", N),))
    d = sub(x, div(Sum("n", x), Const(float(N))))
    var = div(Sum("n", mul(d, d)), Const(float(N)))
    return add(mul(div(d, sqrt(add(var, Const(eps)))), g), bias)


def rmsnorm_eager(eps: float = 1e-6) -> Term:
    x = In("X", (("i", M), ("n", N)))
    w = In("W", (("n", N),))
    return mul(div(x, sqrt(add(div(Sum("n", mul(x, x)), Const(float(N))), Const(eps)))), w)


@pytest.mark.parametrize(("name", "build"), [("layernorm", layernorm_eager),
                                             ("rmsnorm", rmsnorm_eager)])
def test_norm_specs_match_the_eager_terms(name: str, build: object) -> None:
    spec = _spec(name, {"M": M, "N": N})
    if spec is None:
        pytest.skip("no spec parser")
    assert spec is build()  # type: ignore[operator]


def test_layernorm_reaches_a_single_kernel_with_tiled_variance(library: RuleSet) -> None:
    var_sum = (0, 0, 1, 0, 0, 0)  # add > mul > div > sqrt > add > div > Sum
    split = (*var_sum, 0, 0)  # Sum_o > Sum_i > Split
    steps: list[Step] = [
        ("sum-split", var_sum, "forward", {"f": 4}),
        ("split-mul", split, "forward", {}),  # (d * d) split = split d * split d
        ("split-sub-left", (*split, 0), "forward", {}),  # the mean is free of n
        ("split-sub-left", (*split, 1), "forward", {}),
    ]
    out = run_chain(library, layernorm_eager(), steps)
    assert stores(out) == 0
    x = In("X", (("i", M), ("n", N)))
    mean = div(Sum("n", x), Const(float(N)))
    tile = sub(Split("n", 4, x), mean)
    assert Sum("n/o4", Sum("n/i4", mul(tile, tile))) in set(postorder(out))


def test_rmsnorm_reaches_a_single_kernel_with_a_tiled_sum(library: RuleSet) -> None:
    sum_path = (0, 1, 0, 0, 0)  # mul > div > sqrt > add > div > Sum
    steps: list[Step] = [
        ("sum-split", sum_path, "forward", {"f": 2}),
        ("split-mul", (*sum_path, 0, 0), "forward", {}),
    ]
    out = run_chain(library, rmsnorm_eager(), steps)
    x = In("X", (("i", M), ("n", N)))
    xs = Split("n", 2, x)
    assert Sum("n/o2", Sum("n/i2", mul(xs, xs))) in set(postorder(out))
    assert stores(out) == 0


def test_eager_attention_keeps_its_stores_without_rules() -> None:
    assert stores(attention_eager()) == 2
