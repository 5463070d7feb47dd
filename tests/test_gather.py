"""Gathers by integer inputs (issue 18 part 3b): `X[b, labels[b]]`, `E[ids[t], d]`.

Every stage: the spec syntax and its errors (file:line:col), the IR's shape rules, the
interpreter against numpy's fancy indexing, the symbolic semantics against the
interpreter, s-expressions, egglog and the certificate checker's term table, lowering
and the numpy, C and CUDA (CPU shim) renderers against the interpreter on random
programs at odd sizes, and the run-time bounds check: an out-of-range label raises
`GatherIndexError` naming the input, the position and the bound in every executor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen.c import build_c, int32_labels
from kernelsat.codegen.cuda import CUDARenderer, compile_cuda, find_nvcc
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.lower import lower
from kernelsat.codegen.numpy_backend import build_numpy
from kernelsat.driver.pipeline import prove_term
from kernelsat.egraph.saturate import DEFAULT_SCHEDULE, saturate, scheduled_rules
from kernelsat.extract import extract
from kernelsat.extract.base import RooflineCost
from kernelsat.gather import GatherIndexError, check_labels, label_bounds
from kernelsat.hardware.targets import get_target
from kernelsat.inputs import random_inputs as spec_inputs
from kernelsat.interp import evaluate
from kernelsat.ir import LSE, Gather, In, ShapeError, Sum, Term, exp, postorder, sub
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library
from kernelsat.proofs.verify import verify_rule
from kernelsat.proofs.verify_sym import evaluate as sym_evaluate
from kernelsat.proofs.verify_sym import inputs_for as sym_inputs
from kernelsat.proofs.verify_sym import to_float
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import NotIn, instantiate, parse_rules
from kernelsat.sexpr import parse_term
from kernelsat.spec import SpecError, output_dtype, parse_spec
from kernelsat.testing import gather_programs, random_inputs

CE = """kernel ce(B=5, C=7)
in X[b:B, c:C] f32
in labels[b:B] i32
out L[] = mean(b: logsumexp(c: X[b, c]) - X[b, labels[b]])
"""

EMB = """kernel emb(T=3, S=2, V=9, D=5)
in E[v:V, d:D] f32
in ids[t:T, s:S] i32
out Y[t, s, d] = E[ids[t, s], d]
"""


def _dense(term: Term, env: dict[str, np.ndarray]) -> np.ndarray:
    axes = tuple(term.shape)
    return evaluate(term, env).dense(axes, term.shape)


def _run(kind: str, term: Term, env: dict[str, np.ndarray], rows: str = "thread"
         ) -> np.ndarray:
    axes = tuple(term.shape)
    prog = lower(term, axes)
    nests = [k.nest({"cuda.rows": rows} if "cuda.rows" in k.knob_space() else None)
             for k in prog.kernels]
    if kind == "cuda":
        return run_on_cpu(prog, nests, env)
    exe = build_c(prog, nests) if kind == "c" else build_numpy(prog)
    out = np.zeros(prog.buffers["out"].shape, np.float32)
    exe(env, out)
    return out


# -- spec syntax ----------------------------------------------------------------------


def test_cross_entropy_and_embedding_parse_to_gathers_and_match_numpy() -> None:
    p = parse_spec(CE)
    assert [d.dtype for d in p.inputs] == ["f32", "i32"] and output_dtype(p) == "f32"
    env = spec_inputs(p, seed=3)
    assert env["labels"].dtype == np.int32 and label_bounds(p.term) == {"labels": 7}
    x, y = env["X"], env["labels"]
    m = x.max(axis=1)
    want = np.mean(m + np.log(np.exp(x - m[:, None]).sum(axis=1)) - x[np.arange(5), y])
    assert float(evaluate(p.term, env).array) == pytest.approx(want, rel=1e-12)
    q = parse_spec(EMB)
    env = spec_inputs(q, seed=1)
    got = evaluate(q.term, env).dense(("t", "s", "d"), q.term.shape)
    np.testing.assert_array_equal(got, env["E"][env["ids"]])


@pytest.mark.parametrize(("body", "col", "what"), [
    ("X[b, y[b]] + y[b]", 25, "integer input (i32): it can only index a gather"),
    ("X[b, z[b]]", 17, "'z' is not an input"),
    ("X[b, y[b, b]]", 17, "y has 1 dims but is indexed with 2"),
    ("X[b, y[b+1]]", 20, "closing the index of y (plain axes)"),
    ("X[b, y[b] + 1]", 22, "after the gather index y[...]"),
    ("X[b+0, y[b]]", 12, "a gather and an affine index or slice"),
    ("X[b, y[b]] pad 0", 12, "a pad on the gathered use"),
    ("X[b, y[b]", 21, "after the gather index"),
    ("X[b, w[b]]", 17, "w is a f32 input, not an integer one"),
])
def test_gather_errors_name_file_line_and_column(body: str, col: int, what: str) -> None:
    text = (f"kernel k(B=2, C=3)\nin X[b:B, c:C] f32\nin y[b:B] i32\nin w[b:B] f32\n"
            f"out L[b] = {body}\n")
    with pytest.raises(SpecError) as e:
        parse_spec(text, "k.ks")
    assert (e.value.path, e.value.line, e.value.col) == ("k.ks", 5, col), e.value
    assert what in str(e.value)


@pytest.mark.parametrize("kind", ["interp", "c", "cuda"])
def test_nll_of_a_stored_log_softmax_gathers_the_store(kind: str) -> None:
    """`LP[b, y[b]]` of an intermediate gathers its `Store` (computed once, whole); a
    free axis of the gathered name elsewhere (`* X[b, c]`) is another variable."""
    text = ("kernel k(B=5, C=7)\nin X[b:B, c:C] f32\nin y[b:B] i32\n"
            "LP[b, c] = X[b, c] - logsumexp(c: X[b, c])\n"
            "out L[b, c] = -LP[b, y[b]] * X[b, c]\n")
    p = parse_spec(text)
    env = spec_inputs(p, seed=4)
    x, y = env["X"], env["y"]
    lp = x - (np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1))[:, None]
    want = -lp[np.arange(5), y][:, None] * x
    if kind == "interp":
        got = evaluate(p.term, env).dense(("b", "c"), p.term.shape)
    else:
        env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
        got = _run(kind, p.term, env32)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_ir_shape_rules() -> None:
    x = In("X", (("b", 2), ("X.c", 3)))
    with pytest.raises(ShapeError, match="labels must be an input"):
        Gather("X.c", x, exp(In("y", (("b", 2),))))
    with pytest.raises(ShapeError, match="lacks"):
        Gather("c", x, In("y", (("b", 2),)))
    with pytest.raises(ShapeError, match="which the labels also have"):
        Gather("X.c", x, In("y", (("X.c", 3),)))
    with pytest.raises(ShapeError, match="size"):
        Gather("X.c", x, In("y", (("b", 5),)))


# -- run-time bounds --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["interp", "numpy", "c", "cuda"])
@pytest.mark.parametrize("bad", [-1, 7, 1 << 20])
def test_an_out_of_range_label_raises_naming_input_position_and_bound(kind: str,
                                                                      bad: int) -> None:
    term = parse_spec(CE).term
    env = random_inputs(term, seed=2)
    env["labels"][3] = bad
    with pytest.raises(GatherIndexError) as e:
        if kind == "interp":
            evaluate(term, env)
        else:
            _run(kind, term, {k: v.astype(np.float32) if v.dtype.kind == "f" else v
                              for k, v in env.items()})
    assert (e.value.name, e.value.position, e.value.value, e.value.bound) == (
        "labels", (3,), bad, 7)
    assert str(e.value) == (f"input labels[3] = {bad} is out of range: a gather index must "
                            "lie in [0, 7)")


def test_c_reports_the_position_in_a_two_dim_label_input_and_recovers() -> None:
    term = parse_spec(EMB).term
    env = random_inputs(term, seed=5)
    good = _dense(term, env)
    prog = lower(term, tuple(term.shape))
    exe = build_c(prog, [k.nest() for k in prog.kernels])
    out = np.zeros(prog.buffers["out"].shape, np.float32)
    bad = dict(env, ids=env["ids"].copy())
    bad["ids"][2, 1] = 9
    with pytest.raises(GatherIndexError, match=r"input ids\[2, 1\] = 9 .* \[0, 9\)"):
        exe(bad, out)
    exe(env, out)  # the flag was cleared: a good run after a bad one succeeds
    np.testing.assert_allclose(out, good, rtol=1e-6)


def test_label_arrays_are_checked_for_dtype() -> None:
    np.testing.assert_array_equal(int32_labels("y", np.array([1.0, 2.0])), [1, 2])
    assert int32_labels("y", np.array([3], np.int64)).dtype == np.int32
    with pytest.raises(ValueError, match="'y' is an integer input"):
        int32_labels("y", np.array([1.5]))
    with pytest.raises(ValueError, match="outside int32"):
        int32_labels("y", np.array([1 << 40]))
    with pytest.raises(GatherIndexError, match=r"y\[0, 1\] = 2"):
        check_labels("y", np.array([[0, 2]]), 2)


# -- every stage agrees on random programs ------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(gather_programs(), st.integers(0, 2**16))
def test_numpy_and_c_equal_the_interpreter_on_random_gather_programs(term: Term,
                                                                     seed: int) -> None:
    env = random_inputs(term, seed=seed)
    want = _dense(term, env)
    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
    for kind in ("numpy", "c"):
        np.testing.assert_allclose(_run(kind, term, env32), want, rtol=2e-5, atol=2e-5)


@settings(max_examples=8, deadline=None)
@given(gather_programs(sizes=(1, 3, 5)), st.integers(0, 2**16),
       st.sampled_from(["thread", "warp", "block"]))
def test_the_cuda_source_on_the_cpu_shim_equals_the_interpreter(term: Term, seed: int,
                                                                rows: str) -> None:
    """Every row mapping (a thread, a warp or a block per row) reads the labels right."""
    env = random_inputs(term, seed=seed)
    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
    np.testing.assert_allclose(_run("cuda", term, env32, rows), _dense(term, env),
                               rtol=2e-5, atol=2e-5)


@settings(max_examples=25, deadline=None)
@given(gather_programs(sizes=(1, 2, 3)), st.integers(0, 2**16))
def test_symbolic_semantics_and_sexpr_agree_with_the_interpreter(term: Term, seed: int) -> None:
    assert parse_term(repr(term)) is term
    env = random_inputs(term, seed=seed)
    want = _dense(term, env).reshape(-1)
    value = sym_evaluate(term, sym_inputs(term))
    at = {f"{name}[{','.join(map(str, idx))}]": float(arr[idx])
          for name, arr in env.items() for idx in np.ndindex(*arr.shape)}
    got = [to_float(s, at) for s in value.entries(tuple(term.shape), term.shape)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_egglog_round_trip_keeps_the_gather() -> None:
    from kernelsat.egraph.render import render_term

    term = parse_spec(CE).term
    text = render_term(term).text
    assert '(TGather "X.c"' in text
    node = next(n for n in postorder(term) if n.op is Op.GATHER)
    assert node.axis == "X.c"


def test_the_cross_entropy_kernel_is_one_row_pass_with_the_gather_inside() -> None:
    """LSE (online) and the label's load in the same loop over rows: one kernel, the
    gather a single checked load per row."""
    x = In("X", (("b", 6), ("c", 11)))
    term = Sum("b", sub(LSE("c", x), Gather("X.c", In("X", (("b", 6), ("X.c", 11))),
                                            In("y", (("b", 6),)))))
    prog = lower(term, ())
    assert len(prog.kernels) == 1
    text = str(prog.kernels[0].nest())
    assert text.count("gather_check(") == 1 and text.count("for ") == 2


def test_an_embedding_row_checks_its_id_once_then_copies_contiguously() -> None:
    """The id is checked once per token, outside the loop over the row (which is then a
    plain contiguous copy that gcc vectorizes)."""
    term = Gather("E.v", In("E", (("E.v", 7), ("d", 64))), In("ids", (("t", 5),)))
    lines = str(lower(term, ("t", "d")).kernels[0].nest()).splitlines()
    check = next(i for i, line in enumerate(lines) if "gather_check(" in line)
    inner = next(i for i, line in enumerate(lines) if "# d" in line)
    assert check < inner and sum("gather_check(" in line for line in lines) == 1


@pytest.mark.skipif(find_nvcc() is None, reason="no nvcc")
def test_nvcc_compiles_the_gather_source() -> None:
    """The device flag (`atomicCAS` on a `__device__` array), `ks_label` and the `int*`
    parameters compile for sm_90, every row mapping of the cross-entropy kernel."""
    term = parse_spec(CE).term
    prog = lower(term, ())
    sources = []
    for rows in ("thread", "warp", "block"):
        nests = [k.nest({"cuda.rows": rows}) for k in prog.kernels]
        sources.append(CUDARenderer().render(prog, nests))
    report = compile_cuda("\n".join(sources[:1]))
    assert report.ok, report.log[-2000:]
    for src in sources[1:]:
        assert compile_cuda(src).ok


@pytest.mark.parametrize("kind", ["numpy", "c", "cuda"])
def test_a_gather_of_a_computed_value_is_stored_first(kind: str) -> None:
    """Extraction may drop the `Store` under a gather: lowering stores the operand (a
    kernel of its own, computed whole), then gathers from the buffer."""
    x, y = In("X", (("b", 4), ("c", 6))), In("y", (("b", 4),))
    term = Sum("b", sub(LSE("c2", In("X", (("b", 4), ("c2", 6)))), Gather("c", exp(x), y)))
    assert len(lower(term, ()).kernels) == 2
    env = random_inputs(term, seed=9)
    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
    np.testing.assert_allclose(_run(kind, term, env32), _dense(term, env), rtol=2e-5)


@settings(max_examples=15, deadline=None)
@given(gather_programs(sizes=(1, 2, 3, 5, 8, 16)), st.integers(0, 2**16))
def test_c_equals_the_interpreter_at_random_knobs(term: Term, seed: int) -> None:
    """Tiles, loop orders, lanes, kept rows: the label's check lands where its axes are
    bound under every schedule."""
    rng = np.random.default_rng(seed)
    env = random_inputs(term, seed=seed)
    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
    prog = lower(term, tuple(term.shape))
    nests = []
    for k in prog.kernels:
        space = k.knob_space()
        knobs = {name: vals[int(rng.integers(len(vals)))] for name, vals in space.items()}
        nests.append(k.nest(knobs))
    out = np.zeros(prog.buffers["out"].shape, np.float32)
    build_c(prog, nests)(env32, out)
    np.testing.assert_allclose(out, _dense(term, env), rtol=2e-5, atol=2e-5)


# -- rules over gathers (rewrites/gather.rules) -------------------------------------------

GATHER_RULES = library_rules(["gather"])


def test_every_gather_rule_is_proved_for_all_sizes() -> None:
    """The lemma chain reads the label as an opaque index function of its position, so
    each proof covers every size and every in-range label."""
    assert len(GATHER_RULES) >= 20
    for rule in GATHER_RULES:
        v = verify_rule(rule)
        assert v.ok and v.proved_for() == "all sizes", (rule.name, v.counterexample)


@pytest.mark.parametrize("text", [
    # a partial op: the gather skips entries where log is undefined
    "(Gather ?a (log ?x) ?l) => (log (Gather ?a ?x ?l))",
    # a partial op over the gathered axis: the skipped divisors may be 0
    "(Gather ?a (div ?x ?y) ?l) => (div (Gather ?a ?x ?l) (Gather ?a ?y ?l))",
    # wrong: the op dropped, the operands swapped, a free operand gathered away
    "(Gather ?a (exp ?x) ?l) => (Gather ?a ?x ?l)",
    "(Gather ?a (sub ?y ?x) ?l) => (sub (Gather ?a ?x ?l) ?y) if (not-in ?a ?y)",
    "(Gather ?a (max ?x ?y) ?l) => (Gather ?a ?x ?l)",
])
def test_unsound_gather_rules_are_refuted(text: str) -> None:
    rule = parse_rules(f"bad: {text} [gather]")[0]
    assert not verify_rule(rule).ok


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(GATHER_RULES), st.sampled_from([1, 2, 3, 5]),
       st.sampled_from([1, 2, 4, 7]), st.booleans(), st.integers(0, 2**16))
def test_gather_rules_hold_in_the_interpreter_and_in_c(rule, nb: int, nc: int,
                                                      labels_2d: bool, seed: int) -> None:
    """Both sides of every gather rule, instantiated at random sizes (an operand over
    the gathered axis, or free of it where the rule asks), agree in the float64
    interpreter and in generated C on random in-range labels."""
    free = any(isinstance(c, NotIn) for c in rule.conditions)
    x = In("x", (("b", nb), ("c", nc)))
    y = In("w", (("b", nb),)) if free else In("w", (("b", nb), ("c", nc)))
    lab = In("y", (("b", nb), ("s", 2)) if labels_2d else (("b", nb),))
    bind = {"a": "c", "x": x, "y": y, "l": lab}
    lhs = instantiate(rule.lhs, bind, {})
    rhs = instantiate(rule.rhs, bind, {})
    env = random_inputs(lhs, seed=seed)
    want = _dense(lhs, env)
    np.testing.assert_allclose(_dense(rhs, env), want, rtol=1e-12, atol=1e-12)
    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in env.items()}
    for side in (lhs, rhs):
        np.testing.assert_allclose(_run("c", side, env32), want, rtol=2e-5, atol=2e-6)


def test_the_e_graph_pushes_a_gather_of_a_stored_log_softmax_onto_the_input() -> None:
    """NLL of a stored log-softmax, `-LP[b, y[b]]`: with the gather rules (and the Store
    dropped) the roofline extractor picks `X[b, y[b]] - LSE_c X[b, c]`, a gather of the
    input (without them: a gather of the computed difference, which lowering must store
    whole first), and the explanation is a certificate the checker accepts."""
    text = ("kernel k(B=6, C=9)\nin X[b:B, c:C] f32\nin y[b:B] i32\n"
            "LP[b, c] = X[b, c] - logsumexp(c: X[b, c])\n"
            "out L[] = mean(b: -LP[b, y[b]])\n")
    p = parse_spec(text)
    lib = load_library()
    cost = RooflineCost.for_target(get_target("c"))

    def best(rules: list) -> tuple:
        sat = saturate(p.term, rules, schedule=DEFAULT_SCHEDULE, nodes=8000)
        return sat, extract(sat.snapshot, "greedy-dag", cost=cost)[0].term

    def gathers_read_inputs(t: Term) -> bool:
        return all(g.args[0].op is Op.IN for g in postorder(t) if g.op is Op.GATHER)

    rules = scheduled_rules(lib.rules, DEFAULT_SCHEDULE)
    sat, term = best(rules)
    assert gathers_read_inputs(term) and sat.firings.get("gather-sub-free", 0) + sat.firings.get(
        "gather-add-free", 0) > 0
    _, without = best([r for r in rules if r.family != "gather"])
    assert not gathers_read_inputs(without)
    cert, _steps, status = prove_term(p, sat.snapshot, lib, term)
    assert status == "accepted" and cert is not None
    assert any(s.rule.startswith("gather-") for s in cert.steps)
    env = spec_inputs(p, seed=3)
    np.testing.assert_allclose(_dense(term, env), _dense(p.term, env), rtol=1e-12)
