"""The checker never raises and never needs its catch-all: every input, however hostile,
is answered REJECTED for a stated reason, or ACCEPTED only for the claim of a valid
certificate (the same spec term and program).

`check` turns an unexpected exception into a rejection whose reason starts with
"internal error"; these tests fail on such a reason, so a bug in the checker (or in
the parsers it trusts) shows here instead of hiding behind the catch-all. `decode`,
the parser, must raise only `Rejected`.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.proofs.certificate import Certificate
from kernelsat.proofs.checker import FORMAT, CheckResult, Rejected, check, decode

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def deep_list(n: int) -> Any:
    out: Any = 0
    for _ in range(n):
        out = [out]
    return out


def deep_dict(n: int) -> Any:
    out: Any = {}
    for _ in range(n):
        out = {"x": out}
    return out


HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2**40 + 1, 10**400, -(10**400), 0.5, -0.0, 1e308, -1e308,
    math.inf, -math.inf, math.nan, "", "x" * 20_000, "\x00\ud800", "NaN", "(", [], {},
    [None], [[["i", 10**400]]], ["In", ["X", [[["i", 4]]]], []], {"term": 0}, {"int": 10**400},
    deep_list(5_000), deep_dict(5_000),
]
"""Values put everywhere: wrong types, huge and non-finite numbers, deep nesting."""


def verdict(cert: Any) -> CheckResult:
    """check(cert), asserting the answer is a verdict with a reason, never a bug."""
    result = check(cert)
    assert isinstance(result, CheckResult) and isinstance(result.reason, str)
    assert result.reason, result
    assert not result.reason.startswith("internal error"), result.reason
    return result


def decodes_or_rejects(cert: Any) -> None:
    with contextlib.suppress(Rejected):
        decode(cert)


def claim(cert: Any) -> tuple[str, str]:
    d = decode(cert)
    return d.spec.key, d.final.key


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every position in a JSON tree (the root excluded)."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) \
        else ()
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def get(obj: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def put(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def as_text(obj: Any) -> str | None:
    try:
        return json.dumps(obj)
    except (RecursionError, ValueError):
        return None


# -- hostile values at every position of a real certificate --------------------------------


@pytest.mark.parametrize("name", ["softmax", "split"])
def test_every_position_with_every_hostile_value(certs: Any, name: str) -> None:
    base = certs.obj(name)
    base_claim = claim(base)
    positions = list(paths(base))
    assert len(positions) > 60
    tried = 0
    for path in positions:
        for value in HOSTILE:
            obj = certs.obj(name)
            put(obj, path, value)
            for form in (obj, as_text(obj)):
                if form is None:
                    continue
                decodes_or_rejects(form)
                if verdict(form).accepted:  # e.g. the same value written again
                    assert claim(form) == base_claim, (path, value)
                tried += 1
    assert tried > 5000  # docs/proofs.md: over 16,000 for the two certificates


def test_keys_that_are_not_strings(certs: Any) -> None:
    """A parsed object (not JSON text) can have any keys: each object of a certificate
    gets a key of another type, beside its keys and in place of each one."""
    base = certs.obj()
    objects = [()] + [p for p in paths(base) if isinstance(get(base, p), dict)]
    assert len(objects) > 10
    for path in objects:
        for key in (1, None, ("a",), 2.5, b"N", True):
            obj = certs.obj()
            target = get(obj, path)
            target[key] = {"int": 4}
            decodes_or_rejects(obj)
            assert not verdict(obj).accepted
            for old in list(get(certs.obj(), path)):
                obj = certs.obj()
                target = get(obj, path)
                target[key] = target.pop(old)
                decodes_or_rejects(obj)
                assert not verdict(obj).accepted


def test_issue_examples_of_huge_numbers(certs: Any) -> None:
    text = certs.text()
    obj = certs.obj()
    const = next(i for i, row in enumerate(obj["terms"]) if row[0] == "In")
    obj["terms"][const] = ["Const", [int("9" * 400)], []]
    result = verdict(json.dumps(obj))
    assert not result.accepted and "is not a finite float" in result.reason
    for old, new in (('"N": 8', '"N": ' + "1" * 400), ('"M": 4', '"M": 1e400'),
                     ('"N": 8', '"N": NaN'), ('"N": 8', '"N": Infinity'),
                     ('"path": [', '"path": [' + "7" * 400 + ", "),
                     ('["i", 4]', '["i", ' + "4" * 400 + "]"),
                     ('"M": 4', '"M": 4' + "0" * 5000)):
        assert old in text, old
        result = verdict(text.replace(old, new, 1))
        assert not result.accepted, (old, new)


# -- hypothesis: random JSON, random certificate-shaped JSON, random mutations ----------------

SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(10**300, 10**400)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4)
                    | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=25)
KEYS = st.sampled_from(["format", "spec", "kind", "text", "params", "term", "key", "library",
                        "hash", "rules", "name", "terms", "steps", "rule", "direction",
                        "path", "bindings", "final", "int", "str", "float", "N"])
SHAPED = st.recursive(SCALARS | st.just(FORMAT) | st.sampled_from(["ks", "sexpr", "In", "Sum"]),
                      lambda c: st.lists(c, max_size=4) | st.dictionaries(KEYS, c, max_size=6),
                      max_leaves=40)


@FUZZ
@given(JSON)
def test_random_json(value: Any) -> None:
    for form in (value, as_text(value)):
        if form is not None:
            decodes_or_rejects(form)
            assert not verdict(form).accepted


@FUZZ
@given(SHAPED, SHAPED, SHAPED, SHAPED, SHAPED)
def test_random_certificate_shaped_json(spec: Any, lib: Any, terms: Any, steps: Any,
                                        final: Any) -> None:
    obj = {"format": FORMAT, "spec": spec, "library": lib, "terms": terms, "steps": steps,
           "final": final}
    for form in (obj, as_text(obj)):
        if form is not None:
            decodes_or_rejects(form)
            assert not verdict(form).accepted


@FUZZ
@given(st.sampled_from(["softmax", "rmsnorm", "split"]), st.integers(0, 10**6),
       st.sampled_from(["replace", "delete", "insert", "duplicate", "hostile"]), JSON)
def test_random_mutations_of_real_certificates(certs: Any, name: str, pick: int, op: str,
                                               value: Any) -> None:
    obj = certs.obj(name)
    base_claim = claim(obj)
    positions = list(paths(obj))
    path = positions[pick % len(positions)]
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "replace":
        parent[key] = value
    elif op == "hostile":
        parent[key] = HOSTILE[pick % len(HOSTILE)]
    elif op == "delete":
        del parent[key]
    elif op == "insert" and isinstance(parent, dict):
        parent[f"extra{pick % 3}"] = value
    elif op in ("insert", "duplicate") and isinstance(parent, list):
        parent.insert(int(key), value if op == "insert" else parent[key])
    for form in (obj, as_text(obj)):
        if form is not None:
            decodes_or_rejects(form)
            if verdict(form).accepted:
                assert claim(form) == base_claim


@FUZZ
@given(st.integers(0, 10**6), st.text(max_size=12), st.integers(0, 3))
def test_random_edits_of_the_spec_text(certs: Any, at: int, insert: str, cut: int) -> None:
    obj = certs.obj()
    base_claim = claim(obj)
    text = obj["spec"]["text"]
    i = at % (len(text) + 1)
    obj["spec"]["text"] = text[:i] + insert + text[i + cut:]
    result = verdict(json.dumps(obj))
    if result.accepted:  # a comment, a space: the same spec
        assert claim(obj) == base_claim


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["M", "N", "K", "", "n", "M "]),
                       st.integers(-5, 2**64) | st.integers(10**399, 10**400), max_size=3))
def test_random_params(certs: Any, params: dict[str, int]) -> None:
    obj = certs.obj()
    base_claim = claim(obj)
    obj["spec"]["params"] = params
    if verdict(json.dumps(obj)).accepted:
        assert params == {"M": 4, "N": 8} and claim(obj) == base_claim


def test_random_byte_flips(certs: Any) -> None:
    rng = random.Random(3)
    text = certs.text("rmsnorm").encode()
    base_claim = claim(text)
    for _ in range(400):
        data = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        result = verdict(bytes(data))
        decodes_or_rejects(bytes(data))
        if result.accepted:
            assert claim(bytes(data)) == base_claim


def test_objects_that_are_not_json(certs: Any) -> None:
    class Raises:
        def to_json(self) -> str:
            raise OverflowError("from to_json")

    obj = certs.obj()
    obj["steps"][0]["bindings"] = {"f": {"float": math.nan}}
    for cert in (obj, Raises(), object(), {("a",): 1}, {"format": FORMAT, "terms": range(3)},
                 Certificate):
        result = check(cert)
        assert not result.accepted and result.reason
    # a to_json that raises is the caller's bug: named, not hidden
    assert "OverflowError" in check(Raises()).reason
