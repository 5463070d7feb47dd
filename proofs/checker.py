"""The independent proof checker: the trusted core of every shipped program.

It depends only on the IR (`kernelsat.ir`, `kernelsat.ops`) and the rule data
(`kernelsat.rewrites.rule`, and the verified library it compares against), never on
egglog or the explainer. `check` parses a certificate defensively (every field
type-checked, the term table acyclic by construction, sizes and depths bounded),
requires every rule to be the verified library's rule with the exact same text,
then replays every step, one application of a named rule at a stated position,
starting from the spec term, and accepts only a chain that ends exactly at the
claimed program. It never raises on bad input: it answers `CheckResult`.

Certificate JSON (written by `kernelsat.proofs.certificate`):

    {"format": "kernelsat-certificate/1",
     "spec": {"text": ".ks source", "params": {"N": 64}, "term": 7, "key": "..."},
     "library": {"hash": "...", "rules": [{"name": "mul-one", "text": "mul-one: ..."}]},
     "terms": [["In", ["x", [[["i", 4]]]], []], ["Const", [1.0], []], ["mul", [], [0, 1]]],
     "steps": [{"rule": "mul-one", "direction": "forward", "path": [],
                "bindings": {"f": {"int": 4}, "y": {"term": 3}}}],
     "final": {"term": 0, "key": "..."}}

`terms` is a DAG table: each entry is (op, attributes, child indices), and children
must point to earlier entries, so there are no cycles and no dangling references.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from kernelsat.ir import ShapeError, Term
from kernelsat.ops import ARITY, BY_NAME, REDUCTIONS, Op
from kernelsat.rewrites.rule import (
    Bindings,
    Direction,
    Path,
    Rule,
    RuleError,
    apply_at,
    parse_rule,
    pattern_vars,
)

FORMAT = "kernelsat-certificate/1"
DIRECTIONS: tuple[Direction, ...] = ("forward", "backward")
VALUE_TAGS: dict[str, type] = {"term": int, "str": str, "int": int, "float": float}
MAX_ARITY = max(ARITY.values())


class Library(Protocol):
    """The verified rule library: rules by name and a hash of the whole library."""

    by_name: Any
    hash: str


@dataclass(frozen=True)
class Limits:
    """Bounds on what a certificate may contain, so that checking takes bounded time
    and memory whatever the input."""

    max_bytes: int = 64 << 20
    max_terms: int = 500_000
    max_depth: int = 400
    max_steps: int = 50_000
    max_path: int = 400
    max_rule_text: int = 10_000


@dataclass(frozen=True)
class CheckResult:
    """The verdict. `failed_step` is the 0-based index of the first step that does not
    replay (None when the certificate fails before or after the replay)."""

    accepted: bool
    failed_step: int | None
    reason: str


@dataclass(frozen=True)
class Decoded:
    """A parsed certificate whose steps are still raw (decoded one by one when replayed,
    so a long bad chain fails at its first bad step)."""

    spec_text: str
    spec_params: dict[str, int]
    spec: Term
    library_hash: str
    rules: dict[str, str]
    terms: list[Term]
    raw_steps: list[Any]
    final: Term


class Rejected(Exception):
    """Why a certificate is rejected (caught by `check`)."""

    def __init__(self, reason: str, step: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.step = reason, step


def _want(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise Rejected(f"{where}: expected {names}, got {type(value).__name__}")
    return value


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    _want(obj, dict, where)
    if key not in obj:
        raise Rejected(f"{where}: missing field {key!r}")
    return _want(obj[key], kind, f"{where}.{key}")


def _attrs(op: Op, raw: list[Any], where: str) -> tuple[Any, ...]:
    """Attributes of a term-table entry, type-checked per op kind."""
    if op is Op.IN:
        if len(raw) != 2:
            raise Rejected(f"{where}: In takes [name, dims]")
        dims = []
        for g in _want(raw[1], list, where):
            group = []
            for pair in _want(g, list, where):
                if len(_want(pair, list, where)) != 2:
                    raise Rejected(f"{where}: a dim is [axis, size]")
                group.append((_want(pair[0], str, where), _want(pair[1], int, where)))
            dims.append(tuple(group))
        return (_want(raw[0], str, where), tuple(dims))
    kinds: tuple[type | tuple[type, ...], ...] = (
        ((int, float),) if op is Op.CONST
        else (str,) if op in REDUCTIONS
        else (str, int) if op is Op.SPLIT
        else ()
    )
    if len(raw) != len(kinds):
        raise Rejected(f"{where}: {op.value} takes {len(kinds)} attribute(s)")
    return tuple(_want(a, k, where) for a, k in zip(raw, kinds, strict=True))


def _terms(raw: list[Any], limits: Limits) -> list[Term]:
    if len(raw) > limits.max_terms:
        raise Rejected(f"term table has {len(raw)} entries (limit {limits.max_terms})")
    out: list[Term] = []
    depth: list[int] = []
    for i, entry in enumerate(raw):
        where = f"terms[{i}]"
        if len(_want(entry, list, where)) != 3:
            raise Rejected(f"{where}: expected [op, attrs, children]")
        name, attrs, kids = entry
        op = BY_NAME.get(_want(name, str, where))
        if op is None:
            raise Rejected(f"{where}: unknown op {name[:40]!r}")
        _want(kids, list, where)
        if len(kids) != ARITY[op] or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < i for k in kids
        ):
            raise Rejected(f"{where}: {op.value} needs {ARITY[op]} children, each an earlier entry")
        d = 1 + max((depth[k] for k in kids), default=0)
        if d > limits.max_depth:
            raise Rejected(f"{where}: term deeper than {limits.max_depth}")
        try:
            values = _attrs(op, _want(attrs, list, where), where)
            out.append(Term(op, tuple(out[k] for k in kids), values))
        except (ShapeError, ValueError, TypeError) as e:
            raise Rejected(f"{where}: ill-formed term: {e}") from None
        depth.append(d)
    return out


def _term_ref(value: Any, terms: list[Term], where: str) -> Term:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(terms):
        raise Rejected(f"{where}: not a reference into the term table")
    return terms[value]


def decode(cert: Any, limits: Limits = Limits()) -> Decoded:
    """Parse a certificate (JSON text, bytes, or the parsed object). Raises `Rejected`."""
    if isinstance(cert, bytes | str):
        if len(cert) > limits.max_bytes:
            raise Rejected(f"certificate is {len(cert)} bytes (limit {limits.max_bytes})")
        try:
            cert = json.loads(cert)
        except (ValueError, RecursionError) as e:
            raise Rejected(f"not valid JSON: {str(e)[:200]}") from None
    if _field(cert, "format", str, "certificate") != FORMAT:
        raise Rejected(f"unknown format {str(cert['format'])[:40]!r} (expected {FORMAT})")
    terms = _terms(_field(cert, "terms", list, "certificate"), limits)
    spec = _field(cert, "spec", dict, "certificate")
    lib = _field(cert, "library", dict, "certificate")
    final = _field(cert, "final", dict, "certificate")
    params = _field(spec, "params", dict, "spec")
    for k, v in params.items():
        _want(v, int, f"spec.params.{k}")
    rules: dict[str, str] = {}
    for i, r in enumerate(_field(lib, "rules", list, "library")):
        name = _field(r, "name", str, f"library.rules[{i}]")
        text = _field(r, "text", str, f"library.rules[{i}]")
        if name in rules or len(text) > limits.max_rule_text:
            raise Rejected(f"library.rules[{i}]: duplicate or oversized rule {name[:40]!r}")
        rules[name] = text
    steps = _field(cert, "steps", list, "certificate")
    if len(steps) > limits.max_steps:
        raise Rejected(f"{len(steps)} steps (limit {limits.max_steps})")
    d = Decoded(
        spec_text=_field(spec, "text", str, "spec"),
        spec_params=dict(params),
        spec=_term_ref(spec.get("term"), terms, "spec.term"),
        library_hash=_field(lib, "hash", str, "library"),
        rules=rules,
        terms=terms,
        raw_steps=steps,
        final=_term_ref(final.get("term"), terms, "final.term"),
    )
    for label, obj, term in (("spec", spec, d.spec), ("final", final, d.final)):
        if _field(obj, "key", str, label) != term.key:
            raise Rejected(f"{label}.key does not match the {label} term")
    return d


def decode_step(
    raw: Any, i: int, d: Decoded, limits: Limits = Limits()
) -> tuple[str, Direction, Path, Bindings]:
    """(rule, direction, path, bindings) of step `i`. Raises `Rejected` naming the step."""
    try:
        where = f"steps[{i}]"
        rule = _field(raw, "rule", str, where)
        if rule not in d.rules:
            raise Rejected(f"{where}: rule {rule[:40]!r} is not listed in the certificate")
        direction = _field(raw, "direction", str, where)
        if direction not in DIRECTIONS:
            raise Rejected(f"{where}: direction must be forward or backward")
        path = _field(raw, "path", list, where)
        if len(path) > limits.max_path or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < MAX_ARITY for k in path
        ):
            raise Rejected(f"{where}: path must be a short list of child indices")
        bindings: Bindings = {}
        for name, tagged in _field(raw, "bindings", dict, where).items():
            ok = isinstance(tagged, dict) and len(tagged) == 1
            if not ok or not tagged.keys() <= VALUE_TAGS.keys():
                raise Rejected(f"{where}: binding ?{str(name)[:40]} must be {{tag: value}}, "
                               f"tag one of {sorted(VALUE_TAGS)}")
            ((tag, value),) = tagged.items()
            _want(value, VALUE_TAGS[tag], f"{where}.bindings.{name}")
            here = f"{where}.bindings.{name}"
            bindings[name] = _term_ref(value, d.terms, here) if tag == "term" else value
        return rule, direction, tuple(path), bindings
    except Rejected as e:
        raise Rejected(e.reason, i) from None


def _library_rules(d: Decoded, library: Library) -> dict[str, Rule]:
    if d.library_hash != library.hash:
        raise Rejected("library hash differs from the verified library's")
    out: dict[str, Rule] = {}
    for name, text in d.rules.items():
        verified = library.by_name.get(name)
        if verified is None:
            raise Rejected(f"rule {name!r} is not in the verified library")
        try:
            parsed = parse_rule(text)
        except Exception as e:
            raise Rejected(f"rule {name!r} does not parse: {str(e)[:200]}") from None
        if parsed.name != name or text != verified.text() or parsed.key != verified.key:
            raise Rejected(f"rule {name!r} differs from the verified library's text")
        out[name] = verified
    return out


REPLAY_ERRORS = (RuleError, ShapeError, ValueError, KeyError, TypeError, IndexError,
                 ZeroDivisionError, RecursionError)


def _replay(d: Decoded, rules: dict[str, Rule], limits: Limits) -> None:
    cur = d.spec
    for i, raw in enumerate(d.raw_steps):
        name, direction, path, bindings = decode_step(raw, i, d, limits)
        rule = rules[name]
        stray = set(bindings) - pattern_vars(rule.lhs) - pattern_vars(rule.rhs)
        if stray:
            raise Rejected(f"step {i} ({name}): {sorted(stray)[:5]} are not rule variables", i)
        try:
            cur = apply_at(rule, cur, path, direction, bindings)
        except REPLAY_ERRORS as e:
            what = f"step {i} ({name}, {direction}, at {list(path)})"
            raise Rejected(f"{what}: {str(e)[:300]}", i) from None
        if cur.shape != d.spec.shape:
            raise Rejected(f"step {i} ({name}) changes the shape of the program", i)
    if cur is not d.final:
        raise Rejected(f"the chain ends at {str(cur)[:200]}, not at the claimed program")


def check(cert: Any, library: Library | None = None, limits: Limits = Limits()) -> CheckResult:
    """Check a certificate (JSON text, bytes, parsed object, or anything with `to_json()`)
    against the verified `library` (default: `load_library()`)."""
    if library is None:
        from kernelsat.rewrites.library import load_library

        library = load_library()
    try:
        if hasattr(cert, "to_json"):
            cert = cert.to_json()
        d = decode(cert, limits)
        _replay(d, _library_rules(d, library), limits)
    except Rejected as e:
        return CheckResult(False, e.step, e.reason)
    except RecursionError:
        return CheckResult(False, None, "certificate nested too deeply")
    return CheckResult(True, None, f"{len(d.raw_steps)} steps replay from the spec to the program")
