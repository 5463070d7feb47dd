"""Malformed specs are rejected with a SpecError at the right line and column, never a
traceback. Each file in tests/malformed/ states its expectation on its first line:
`# expect: LINE:COL substring-of-the-message`."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelsat.interp import evaluate_as
from kernelsat.spec import SpecError, load_spec, parse_spec

MALFORMED = sorted((Path(__file__).parent / "malformed").glob("*.ks"))
SPECS = sorted((Path(__file__).parent.parent / "specs").glob("*.ks"))
EXPECT = re.compile(r"# expect: (\d+):(\d+) (.+)")


def test_there_are_enough_malformed_files() -> None:
    assert len(MALFORMED) >= 12


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.stem)
def test_malformed_spec_is_rejected_where_expected(path: Path) -> None:
    m = EXPECT.match(path.read_text().splitlines()[0])
    assert m, f"{path.name} lacks an '# expect: L:C message' header"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert (err.line, err.col) == (int(m[1]), int(m[2])), str(err)
    assert m[3] in str(err)
    assert str(err).startswith(f"{path}:{m[1]}:{m[2]}: ")
    assert "; expected " in str(err)


GOOD = """kernel k(M=4, N=8)
in X[i:M, n:N] f32
out Y[i, n] = softmax(n: X[i, n])
"""


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"Q": 3}, "unknown parameter 'Q'"),
        ({"N": 0}, "is not positive"),
        ({"N": -4}, "is not positive"),
        ({"N": 2.5}, "is not an integer"),
        ({"N": "8"}, "is not an integer"),
        ({"N": True}, "is not an integer"),
    ],
)
def test_bad_parameter_override(params: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(GOOD, "good.ks", params)
    assert (info.value.line, info.value.col) == (1, 1)


def test_spec_error_is_a_value_error_with_its_parts() -> None:
    with pytest.raises(ValueError) as info:
        parse_spec("kernel k(N=2)\nin X[i:N] f32\nout Y[i] = Z[i]\n", "a.ks")
    err = info.value
    assert isinstance(err, SpecError)
    assert (err.path, err.line, err.col) == ("a.ks", 3, 12)
    assert str(err) == (
        "a.ks:3:12: unknown name 'Z'; expected an input, an intermediate defined above, "
        "a size parameter, an axis (its index as a value) or inf"
    )


def test_empty_spec() -> None:
    with pytest.raises(SpecError, match="empty spec"):
        parse_spec("# nothing\n\n")


def test_group_annotation_conflicting_with_a_binding() -> None:
    text = """kernel k(N=4, H=2, D=8)
in X[i:N, x:H*D] f32
in W[h:H] f32
out Y[i, h, d] = X[i, (h:4, d)] * W[h]
"""
    with pytest.raises(SpecError, match="axis 'h' has size 2 here but 4 at 4:24") as info:
        parse_spec(text)
    assert (info.value.line, info.value.col) == (4, 37)


def test_group_in_an_intermediate_use() -> None:
    """A group on an intermediate's dim is a reshape (issue 18 part 5): `(j)` reads the
    dim whole; a group whose sizes do not fill the dim is an error at the group."""
    text = """kernel k(N=4)
in X[i:N, j:N] f32
S[i, j] = exp(X[i, j])
out Y[i, j] = S[i, (j)]
"""
    x = np.arange(16.0).reshape(4, 4) / 16
    p = parse_spec(text)
    np.testing.assert_allclose(evaluate_as(p.term, {"X": x}, p.out_axes), np.exp(x))
    with pytest.raises(SpecError, match="do not divide the packed dim") as info:
        parse_spec(text.replace("(j)", "(a:3, k)"))
    assert (info.value.line, info.value.col) == (4, 20)


def test_diagonal_use_is_rejected() -> None:
    text = "kernel k(N=4)\nin X[i:N, j:N] f32\nout Y[i] = X[i, i]\n"
    with pytest.raises(SpecError, match="bound twice") as info:
        parse_spec(text)
    assert (info.value.line, info.value.col) == (3, 17)


# -- fuzzing: any edit of a valid spec parses or raises SpecError, nothing else ----------

_PIECES = ["[", "]", "(", ")", ",", ":", "=", "+", "-", "*", "/", "x", "i", "n", "N", "sum",
           "softmax", "max", "(h, d)", "1e-3", "0", "out ", "in ", "kernel ", "\n", " ", "#", "@"]


@given(
    spec=st.sampled_from(SPECS),
    edits=st.lists(
        st.tuples(st.floats(0, 1), st.integers(0, 3), st.sampled_from(_PIECES)),
        min_size=1, max_size=4,
    ),
)
def test_edited_specs_parse_or_fail_cleanly(
    spec: Path, edits: list[tuple[float, int, str]]
) -> None:
    text = spec.read_text()
    for where, cut, piece in edits:
        k = int(where * len(text))
        text = text[:k] + piece + text[k + cut :]
    try:
        program = parse_spec(text, "fuzz.ks")
    except SpecError as e:
        assert re.match(r"fuzz\.ks:\d+:\d+: .+; expected .+", str(e)), str(e)
    else:
        assert program.term.shape.keys() == set(program.out_axes)


def test_ir_shape_errors_become_spec_errors() -> None:
    text = "kernel k(N=4)\nin X[i:N] f32\nout Y[i] = X[i] * 1e999\n"
    with pytest.raises(SpecError, match="ill-formed expression: Const must be a finite") as info:
        parse_spec(text)
    assert (info.value.line, info.value.col) == (3, 19)
