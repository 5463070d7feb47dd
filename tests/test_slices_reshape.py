"""Slices along an axis (`X[b, 0:F]`, `X[b, j=F:2*F:2]`), reshapes at the boundary
(a packed dim read as a group of axes: `T[b, (h, d)]` on an intermediate, `in X[b:B,
(h:H, d:D)]`), grouped-query attention reaching the fused kernel, and `rename` through
the maps of affine reads (issue 18 part 5). Each against numpy, through the backends."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import build, lower, run_program
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.flash import find_flash
from kernelsat.driver.pipeline import saturate_program
from kernelsat.extract import extract
from kernelsat.extract.online import online_preference
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, Dot, In, Read, SoftmaxAvg, Term, div, sqrt, tanh
from kernelsat.program import Program
from kernelsat.proofs.certificate import make_certificate
from kernelsat.proofs.checker import check
from kernelsat.proofs.library import load_library
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import apply_at
from kernelsat.spec import SpecError, parse_spec
from kernelsat.testing import SpecCase, relative_error, reshape_specs, slice_specs

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(case: SpecCase, seed: int = 0) -> None:
    program = parse_spec(case.text)
    env = random_inputs(program, seed=seed)
    got = evaluate_as(program.term, env, program.out_axes).reshape(program.out_shape)
    want = case.reference(env)
    assert got.shape == want.shape, case.text
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=case.text)


@FAST
@given(slice_specs(), st.integers(0, 3))
def test_a_slice_equals_numpys(case: SpecCase, seed: int) -> None:
    _check(case, seed)


@FAST
@given(reshape_specs(), st.integers(0, 3))
def test_a_grouped_use_equals_numpys_reshape(case: SpecCase, seed: int) -> None:
    _check(case, seed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(slice_specs(), reshape_specs()), st.sampled_from(["numpy", "c"]))
def test_slices_and_reshapes_run_on_the_backends(case: SpecCase, backend: str) -> None:
    program = parse_spec(case.text)
    env = random_inputs(program, seed=0)
    want = case.reference(env)
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    got = run_program(program.term, program.out_axes, env32, backend)
    assert relative_error(got.reshape(program.out_shape), want) < 1e-5, case.text


# -- grouped-query attention: the fused kernel, K and V shared by a group of query heads


GQA = """kernel gqa(B=1, G=2, R=3, N=17, D=5)
in  Q[b:B, h:G*R, i:N, d:D] f32
in  K[b:B, g:G, n:N, d:D] f32
in  V[b:B, g:G, n:N, e:D] f32
S[b,g,r,i,n] = sum(d: Q[b,(g,r),i,d] * K[b,g,n,d]) / sqrt(D)
P[b,g,r,i,n] = softmax(n: S[b,g,r,i,n])
out O[b,(g,r),i,e] = sum(n: P[b,g,r,i,n] * V[b,g,n,e])
"""


def _fused_gqa(program: Program) -> Term:  # the online form the rules reach, written out
    b, g, r, n, d = (program.params[k] for k in "BGRND")
    q = In("Q", ((("b", b),), (("g", g), ("r", r)), (("i", n),), (("d", d),)))
    k = In("K", (("b", b), ("g", g), ("n", n), ("d", d)))
    v = In("V", (("b", b), ("g", g), ("n", n), ("e", d)))
    return SoftmaxAvg("n", Dot("d", k, div(q, sqrt(Const(float(d))))), v)


@pytest.mark.parametrize("sizes", [{}, {"R": 1}, {"G": 1, "R": 4, "N": 33, "D": 3},
                                   {"B": 2, "G": 3, "R": 2, "N": 1, "D": 1}])
def test_grouped_query_attention_runs_fused_and_equals_the_spec(sizes) -> None:
    program = parse_spec(GQA, params=sizes)
    term = _fused_gqa(program)
    lowered = lower(term, program.out_axes)
    found = find_flash(lowered.kernels[-1])
    assert found is not None
    # the row blocked is the larger query-only axis, i (the query positions) or r; the
    # other loops as a batch axis (the keys do not move along r: stride 0)
    assert found.m == max(program.params["N"], program.params["R"])
    env = random_inputs(program, seed=1)
    want = evaluate_as(program.term, env, program.out_axes)
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    space = lowered.kernels[-1].knob_space()
    for knobs in [{"flash": True}] + [{"flash": True, k: v} for k, vs in space.items()
                                      if k != "flash" for v in vs]:
        exe = build(lowered, "c", [knobs])
        out = np.empty(lowered.buffers["out"].shape, np.float32)
        exe(env32, out)
        assert relative_error(out.reshape(want.shape), want) < 1e-5, knobs


def test_gqa_spec_reaches_the_fused_kernel_through_the_rules() -> None:
    program = parse_spec(GQA, params={"N": 128, "D": 16})
    sat = saturate_program(program, load_library())
    best = extract(sat.snapshot, "greedy-tree", cost=online_preference)[0].term
    lowered = lower(best, program.out_axes)
    assert find_flash(lowered.kernels[-1]) is not None


# -- renaming the axes of an intermediate that reads through affine maps ---------------


@FAST
@given(si=st.integers(1, 5), sj=st.integers(1, 5), shifts=st.lists(st.integers(-2, 2),
       min_size=4, max_size=4), new=st.sampled_from([("j", "i"), ("p", "q"), ("j", "p"),
                                                     ("q", "i"), ("i", "j")]),
       stride=st.integers(1, 2), seed=st.integers(0, 3))
def test_renaming_a_programs_axes_preserves_its_value(si, sj, shifts, new, stride,
                                                      seed) -> None:
    """U (which reads T, which reads X, both at affine maps over axes named i and j)
    used as U[x, y] for new names x, y: the map axes are renamed, the operands' kept."""
    if set(new) & {"i", "j"}:
        sj = si  # one size per axis name in a kernel
    a, b, c, d = (f"+ {k}" if k >= 0 else f"- {-k}" for k in shifts)
    head = (f"kernel k(SI={si}, SJ={sj})\nin X[i:SI, j:SJ] f32\n"
            f"T[i, j] = exp(X[{stride}*i {a}, j {b}] pad 0) + 0 * X[i, j]\n"
            f"U[i, j] = T[i {c}, j {d}] pad -1 * T[i, j]\n")
    x, y = new
    plain = parse_spec(head + "out Y[i, j] = U[i, j]\n")
    renamed = parse_spec(head + f"out Y[{y}, {x}] = U[{x}, {y}]\n")
    env = random_inputs(plain, seed=seed)
    want = evaluate_as(plain.term, env, plain.out_axes)
    got = evaluate_as(renamed.term, env, renamed.out_axes)
    np.testing.assert_array_equal(got, want.T)


# -- parse-time errors ------------------------------------------------------------------


BAD = [
    ("out Y[i, f] = X[i, 0:9]", "3:20", "reaches outside 0..8"),
    ("out Y[i, f] = X[i, 4:4]", "3:20", "is empty"),
    ("out Y[i, f] = X[i, 5:2]", "3:20", "is empty"),
    ("out Y[i, f] = X[i, 0:8:0]", "3:20", "has step 0"),
    ("out Y[i, f] = X[i, 0:4] * X[i, 0:3]", "3:32", "has 3 elements, but its axis f"),
    ("out Y[i, j] = X[i, j=0:4] * X[i, j=1:4]", "3:34", "axis 'j' has size 3 here but 4"),
    ("out Y[i, f] = X[i, 0:4:2:1]", "3:25", "unexpected ':' after a slice"),
    ("out Y[i, f] = X[i, 0:4 5]", "3:24", "unexpected '5' after a slice"),
    ("out Y[i, f] = X[i, 0:Q]", "3:22", "unknown size parameter 'Q'"),
    ("out Y[i, f] = X[i, 0:2F]", "3:23", "a product is written 2*F"),
    ("T[i, f] = X[i, f]\nout Y[i, h, d] = T[i, (h, d)]", "4:24", "cannot infer the sizes"),
    ("T[i, f] = X[i, f]\nout Y[i, h, d] = T[i, (h:3, d)]", "4:23",
     "the group's known sizes (3) do not divide the packed dim (8)"),
]


@pytest.mark.parametrize("line,where,what", BAD)
def test_bad_slices_and_reshapes_are_errors_at_their_token(line, where, what) -> None:
    text = f"kernel k(M=2, F=8)\nin X[i:M, f:F] f32\n{line}\n"
    with pytest.raises(SpecError) as e:
        parse_spec(text, "s.ks")
    assert str(e.value).startswith(f"s.ks:{where}:"), str(e.value)
    assert what in str(e.value), str(e.value)


def test_a_packed_declaration_reads_as_its_axes_or_whole() -> None:
    text = ("kernel k(M=2, H=3, D=4)\nin X[i:M, (h:H, d:D)] f32\n"
            "out Y[i, h] = sum(d: X) + sum(j: X[i, j]) * 0 + 0 * h\n")
    p = parse_spec(text)
    assert p.inputs[0].dims == (2, 12) and p.inputs[0].dim_names == ("i", "(h, d)")
    env = random_inputs(p, seed=0)
    want = env["X"].reshape(2, 3, 4).sum(axis=2)
    np.testing.assert_allclose(evaluate_as(p.term, env, p.out_axes), want, rtol=1e-12)
    with pytest.raises(SpecError, match="dim h declared twice"):
        parse_spec("kernel k(H=3)\nin X[h:H, (h:H, d:2)] f32\nout Y[h] = X[h, j] * 0\n")


# -- certificates carry long affine maps (the checker's 200-character name limit) -------


def test_a_certificate_over_a_read_map_longer_than_a_name_is_accepted() -> None:
    """A conv3d-like read with long axis names has a map text of 500 characters: the
    checker bounds names and string bindings at 200 characters but a `Read`'s map in
    the term table at 1600, and no rule binds a map as a string (maps are matched in
    the terms), so long maps are checked, not dropped. Past the bound: rejected (a
    resource bound: coverage, never soundness)."""
    rules = [r for r in library_rules(["affine"]) if r.name == "read-tanh"]
    lib = SimpleNamespace(rules=rules, by_name={r.name: r for r in rules},
                          hash=hashlib.sha256(rules[0].key.encode()).hexdigest())

    def read(names: list[str]) -> Term:
        x = In("X", tuple((n, 3) for n in names))
        forms = {n: ({f"out_{n}": 1, f"kernel_{n}": 1}, -1) for n in names}
        sizes = {f"{p}_{n}": 2 for n in names for p in ("out", "kernel")}
        return Read(tanh(x), forms, sizes, 0.0)

    long5 = read(["batch_index", "channel_index", "depth_position", "height_position",
                  "width_position"])
    assert 200 < len(str(long5.attrs[0])) < 1600
    for t, ok in ((long5, True), (read([f"axis_number_{k:02d}_of_many" for k in range(12)]),
                                  False)):
        final = apply_at(rules[0], t, (), "forward", {})
        cert = make_certificate(t, "", [Step("read-tanh", "forward", (), {})], final, lib)
        result = check(json.dumps(cert.to_obj()), lib)
        assert result.accepted == ok, result.reason
        if not ok:
            assert "map text of at most 1600" in result.reason


# -- the CUDA source on the CPU shim -----------------------------------------------------


@pytest.mark.parametrize("knobs", [{}, {"cuda.keys": 16, "tpb": 64}])
def test_fused_gqa_cuda_source_on_the_cpu_shim(knobs: dict[str, object]) -> None:
    program = parse_spec(GQA, params={"N": 37, "D": 5, "R": 2})
    term = _fused_gqa(program)
    lowered = lower(term, program.out_axes)
    assert "cuda.keys" in lowered.kernels[0].knob_space()
    env = random_inputs(program, seed=2)
    out = run_on_cpu(lowered, lowered.nests([knobs]), env)
    want = evaluate_as(program.term, env, program.out_axes)
    assert relative_error(out.reshape(want.shape), want) < 1e-5


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(slice_specs(), reshape_specs()))
def test_slices_and_reshapes_cuda_source_on_the_cpu_shim(case: SpecCase) -> None:
    program = parse_spec(case.text)
    env = random_inputs(program, seed=0)
    lowered = lower(program.term, program.out_axes)
    out = run_on_cpu(lowered, lowered.nests([{} for _ in lowered.kernels]), env)
    want = case.reference(env)
    assert relative_error(out.reshape(want.shape), want) < 1e-5, case.text


# -- slices beside the other index forms in one use --------------------------------------


def test_slices_mix_with_groups_affine_items_and_pads_in_one_use() -> None:
    text = """kernel k(B=2, G=2, CG=3, H=7, W=5)
in X[b:B, c:G*CG, y:H, x:W] f32
axis w:W - 1
T[b, c, y, x] = exp(X[b, c, y, x])
out Y[b, g, ci, h, w] = X[b, (g:G, ci), h=1:H-1:2, w + 1] pad 0 + T[b, (g, ci), h=0:H-2:2, w] * 2
"""
    p = parse_spec(text)
    env = random_inputs(p, seed=3)
    x = env["X"]
    want = x[:, :, 1:6:2, 1:] + np.exp(x)[:, :, 0:5:2, :4] * 2
    want = want.reshape(2, 2, 3, 3, 4)
    got = evaluate_as(p.term, env, p.out_axes)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for backend in ("numpy", "c"):
        out = run_program(p.term, p.out_axes, {k: v.astype(np.float32) for k, v in env.items()},
                          backend)
        assert relative_error(out, want) < 1e-5, backend


def test_renaming_into_a_bound_axis_of_a_read_inside_a_reduction() -> None:
    """U[i] = sum(j: X[i + j] pad 0 * W[j]) used as U[j]: the reduction's j gets a fresh
    name, and the read's map follows both renamings."""
    head = ("kernel k(N=3)\nin X[x:N] f32\nin W[j:N] f32\naxis i:N\n"
            "U[i] = sum(j: X[i + j] pad 0 * W[j])\n")
    plain = parse_spec(head + "out Y[i] = U[i]\n")
    renamed = parse_spec(head + "out Y[j] = U[j]\n")
    env = random_inputs(plain, seed=0)
    x, w = env["X"], env["W"]
    want = np.array([sum(x[i + j] * w[j] for j in range(3) if i + j < 3) for i in range(3)])
    np.testing.assert_allclose(evaluate_as(plain.term, env, plain.out_axes), want)
    np.testing.assert_allclose(evaluate_as(renamed.term, env, renamed.out_axes), want)
