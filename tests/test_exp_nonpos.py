"""The exp of an argument known to be at most 0 (`exp_nonpos`, `loops.VARIANT_OF`): the
lowering recognises it from the term's structure (a max-subtracted argument, `-|y|`,
the online reductions' weights), and the cheaper C function it renders gives bit for
bit the value of the full `ks_exp` on every input, special values included; an
elementwise max is not trusted (C's max drops a NaN operand)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen.c import CExecutable, CRenderer, build_c
from kernelsat.codegen.cuda_emulate import OPS_F64
from kernelsat.codegen.loops import Loop, Stmt, walk_calls
from kernelsat.codegen.lower import lower, nonpositive
from kernelsat.hardware.schedule_model import kernel_features
from kernelsat.hardware.targets import get_target
from kernelsat.ir import LSE, In, Max, Sum, Term, abs_, add, div, exp, max_, neg, sub

X = In("x", (("i", 8), ("n", 40)))

TERMS: dict[str, Term] = {
    "softmax": div(exp(sub(X, Max("n", X))), Sum("n", exp(sub(X, Max("n", X))))),
    "logsumexp": add(Max("n", X), LSE("n", sub(X, Max("n", X)))),
    "online lse": LSE("n", X),
    "exp -|x|": exp(neg(abs_(X))),
}


class FullExp(CRenderer):
    """Renders every `exp_nonpos` as the full `ks_exp`."""

    code_for_op: ClassVar = {**CRenderer.code_for_op,
                             "exp_nonpos": CRenderer.code_for_op["exp"]}


def calls(stmts: tuple[Stmt, ...]) -> list[str]:
    out: list[str] = []
    for s in stmts:
        if isinstance(s, Loop):
            out += calls(s.body)
        else:
            for e in [getattr(s, "expr", None)]:
                if e is not None:
                    out += [c.op for c in walk_calls(e)]
    return out


def test_structural_recognition() -> None:
    assert nonpositive(sub(X, Max("n", X)))
    assert nonpositive(sub(X, LSE("n", X)))
    assert nonpositive(neg(abs_(X)))
    assert not nonpositive(sub(Max("n", X), X))
    assert not nonpositive(sub(X, Max("n", In("y", (("i", 8), ("n", 40))))))
    # an elementwise max may drop a NaN operand in C: not trusted
    assert not nonpositive(sub(X, max_(Max("n", X), In("z", (("i", 8),)))))


@pytest.mark.parametrize("name", sorted(TERMS))
def test_the_lowering_uses_the_variant_and_prices_it_as_exp(name: str) -> None:
    low = lower(TERMS[name], tuple(sorted(TERMS[name].shape)))
    nest = low.kernels[0].nest()
    ops = calls(nest.body)
    assert "exp_nonpos" in ops and "exp" not in ops
    feats = kernel_features(low.kernels[0], {}, get_target("cpu"))
    assert feats.transcendentals >= 8 * 40  # counted as the exp it is
    assert OPS_F64["exp_nonpos"](-1.5) == OPS_F64["exp"](-1.5)


BUILT: dict[str, tuple[CExecutable, CExecutable]] = {}


def pair(name: str) -> tuple[CExecutable, CExecutable]:
    if name not in BUILT:
        low = lower(TERMS[name], tuple(sorted(TERMS[name].shape)))
        nests = low.nests()
        BUILT[name] = (build_c(low, nests), build_c(low, nests, renderer=FullExp()))
    return BUILT[name]


SPECIAL = [0.0, -0.0, 1.0, -1.0, 88.0, -88.0, 1e30, -1e30, 3.4e38, -3.4e38, np.inf, -np.inf,
           np.nan, 1e-40, -87.4, -87.3]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(TERMS)),
       st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-200, 200, width=32)),
                min_size=320, max_size=320))
def test_the_variant_equals_the_full_exp_bit_for_bit(name: str, values: list[float]) -> None:
    fast, full = pair(name)
    x = np.asarray(values, np.float32).reshape(8, 40)
    shape = fast.prog.buffers["out"].shape
    a, b = np.empty(shape, np.float32), np.empty(shape, np.float32)
    with np.errstate(all="ignore"):
        fast({"x": x}, a)
        full({"x": x}, b)
    assert np.array_equal(a, b, equal_nan=True)
    assert "ks_exp_nonpos(" in fast.source and "ks_exp_nonpos(" not in full.source.split(
        "volatile int ks_cancel")[1]


def test_a_max_subtracted_spec_kernel_calls_the_variant() -> None:
    low = lower(TERMS["softmax"], ("i", "n"))
    source = CRenderer().render(low, low.nests())
    body = source.split("volatile int ks_cancel")[1]
    assert "ks_exp_nonpos(" in body and "ks_exp(" not in body
