"""The independent proof checker: the trusted core of every shipped program.

It depends only on the IR (`kernelsat.ir`, `kernelsat.ops`), the rule data
(`kernelsat.rewrites.rule`, and the shipped rule files through
`kernelsat.rewrites.library`) and the two parsers that say what a spec is
(`kernelsat.spec` for `.ks` text, `kernelsat.sexpr` for a term); never on egglog, z3
or the explainer. `check` parses a certificate defensively (every field type-checked,
the term table acyclic by construction, sizes, depths and numbers bounded),
re-derives the spec term from the spec text and parameters and requires it to be the
certificate's spec term, requires every rule to be the verified library's rule with
the exact same text, then replays every step, one application of a named rule at a
stated position, starting from the spec term, and accepts only a chain that ends
exactly at the claimed program. It never raises: any input gets a `CheckResult`.

Certificate JSON (written by `kernelsat.proofs.certificate`):

    {"format": "kernelsat-certificate/2",
     "spec": {"kind": "ks", "text": ".ks source", "params": {"N": 64}, "term": 7, "key": "..."},
     "library": {"hash": "...", "rules": [{"name": "mul-one", "text": "mul-one: ..."}]},
     "terms": [["In", ["x", [[["i", 4]]]], []], ["Const", [1.0], []], ["mul", [], [0, 1]]],
     "steps": [{"rule": "mul-one", "direction": "forward", "path": [],
                "bindings": {"f": {"int": 4}, "y": {"term": 3}}}],
     "final": {"term": 0, "key": "..."}}

`spec.kind` is `ks` (the text is `.ks` source, parsed at `params`) or `sexpr` (the text
is the term's canonical s-expression; no params). `terms` is a DAG table: each entry is
(op, attributes, child indices), and children must point to earlier entries, so there
are no cycles and no dangling references.

Stand-alone: `python -m kernelsat.proofs.checker CERT [--spec FILE] [-p K=V]` prints
ACCEPTED or REJECTED and exits 0 or 1 (2 for a file it cannot read or parse).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any, Protocol

from kernelsat.ir import ShapeError, Term
from kernelsat.ops import ARITY, AXIS_ATTR, BY_NAME, Op
from kernelsat.proofs.proof_kinds import shipped_kind, weakest
from kernelsat.rewrites.library import RuleSet, library_rules
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
from kernelsat.sexpr import parse_term
from kernelsat.spec import parse_params, parse_spec
from kernelsat.spec_syntax import read_source

FORMAT = "kernelsat-certificate/2"
OLD_FORMATS = ("kernelsat-certificate/1",)
SPEC_KINDS = ("ks", "sexpr")
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
    max_spec_text: int = 1 << 18
    max_size: int = 1 << 40  # axis sizes, split factors, params, integer bindings
    max_name: int = 200  # input, axis and rule names, string bindings


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
    so a long bad chain fails at its first bad step). `spec` is bound to the spec text:
    it is the term the text re-derives to."""

    spec_kind: str
    spec_text: str
    spec_params: dict[str, int]
    spec: Term
    spec_label: str
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


FIELDS: dict[str, frozenset[str]] = {
    "certificate": frozenset({"format", "spec", "library", "terms", "steps", "final"}),
    "spec": frozenset({"kind", "text", "params", "term", "key"}),
    "library": frozenset({"hash", "rules"}),
    "rule": frozenset({"name", "text", "proof"}),  # proof: informational, not trusted
    "step": frozenset({"rule", "direction", "path", "bindings"}),
    "final": frozenset({"term", "key"}),
}
"""The fields of each object: a certificate holds nothing the checker does not read."""


def _only(obj: Any, kind: str, where: str) -> dict[str, Any]:
    extra = [k for k in _want(obj, dict, where) if k not in FIELDS[kind]]
    if extra:
        raise Rejected(f"{where}: unknown field {str(extra[0])[:40]!r} (a {kind} has "
                       f"{', '.join(sorted(FIELDS[kind]))})")
    return dict(obj)


def _names(obj: dict[Any, Any], where: str, limits: Limits) -> None:
    for k in obj:
        _name(k, f"{where} key", limits)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {len(text)}-character {type(value).__name__}"


def _count(value: Any, where: str, limits: Limits, low: int = 1) -> int:
    """An integer in low..max_size (a size, a factor, a parameter)."""
    if not low <= _want(value, int, where) <= limits.max_size:
        raise Rejected(f"{where}: {_show(value)} is not in {low}..{limits.max_size}")
    return int(value)


def _name(value: Any, where: str, limits: Limits) -> str:
    if len(_want(value, str, where)) > limits.max_name:
        raise Rejected(f"{where}: a name longer than {limits.max_name} characters")
    return str(value)


def _attrs(op: Op, raw: list[Any], where: str, limits: Limits) -> tuple[Any, ...]:
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
                group.append((_name(pair[0], where, limits), _count(pair[1], where, limits)))
            dims.append(tuple(group))
        return (_name(raw[0], where, limits), tuple(dims))
    if op is Op.CONST:
        if len(raw) != 1:
            raise Rejected(f"{where}: Const takes one number")
        try:
            value = float(_want(raw[0], (int, float), where))
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise Rejected(f"{where}: Const {_show(raw[0])} is not a finite float")
        return (value,)
    if op in AXIS_ATTR:  # a reduction's axis, a gather's axis
        if len(raw) != 1:
            raise Rejected(f"{where}: {op.value} takes 1 attribute")
        return (_name(raw[0], where, limits),)
    if op is Op.READ:  # affine reads: one map text, parsed and checked by the IR
        if len(raw) != 1 or len(_want(raw[0], str, where)) > 8 * limits.max_name:
            raise Rejected(f"{where}: Read takes 1 map text of at most "
                           f"{8 * limits.max_name} characters")
        return (str(raw[0]),)
    if op is Op.SPLIT or op is Op.IDX:
        if len(raw) != 2:
            raise Rejected(f"{where}: {op.value} takes 2 attributes")
        return (_name(raw[0], where, limits), _count(raw[1], where, limits))
    if raw:
        raise Rejected(f"{where}: {op.value} takes 0 attributes")
    return ()


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
            values = _attrs(op, _want(attrs, list, where), where, limits)
            out.append(Term(op, tuple(out[k] for k in kids), values))
        except (ShapeError, ValueError, TypeError, ArithmeticError) as e:
            raise Rejected(f"{where}: ill-formed term: {str(e)[:300]}") from None
        depth.append(d)
    return out


def _term_ref(value: Any, terms: list[Term], where: str) -> Term:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(terms):
        raise Rejected(f"{where}: not a reference into the term table")
    return terms[value]


# -- the spec: re-derived from its text, never taken on trust ------------------------------


@functools.lru_cache(maxsize=32)
def _derive(kind: str, text: str, params: tuple[tuple[str, int], ...]) -> tuple[Term, str]:
    if kind == "ks":
        program = parse_spec(text, "spec.text", dict(params))
        sizes = ", ".join(f"{k}={v}" for k, v in program.params.items())
        return program.term, f"kernel {program.name}({sizes})"
    term = parse_term(text, "spec.text")
    return term, f"the term {text[:80]}{'...' if len(text) > 80 else ''}"


def derive_spec(kind: str, text: str, params: Mapping[str, int],
                limits: Limits = Limits()) -> tuple[Term, str]:
    """(term, label) that a certificate's spec fields denote, re-derived by the trusted
    parsers: `.ks` text at `params` (kind `ks`) or a term's s-expression (kind `sexpr`).
    Raises `Rejected` when they denote nothing."""
    if kind not in SPEC_KINDS:
        raise Rejected(f"spec.kind: {kind[:40]!r} is not one of {', '.join(SPEC_KINDS)}")
    if len(text) > limits.max_spec_text:
        raise Rejected(f"spec.text is {len(text)} characters (limit {limits.max_spec_text})")
    for k, v in params.items():
        _count(v, f"spec.params.{k[:40]}", limits)
    if kind == "sexpr" and params:
        raise Rejected("spec.params: an s-expression spec takes no parameters")
    try:
        return _derive(kind, text, tuple(sorted(params.items())))
    except (ValueError, ArithmeticError, RecursionError) as e:
        what = "a .ks spec" if kind == "ks" else "a term"
        at = f" at {dict(params)}" if params else ""
        raise Rejected(f"spec.text does not parse as {what}{at}: {str(e)[:300]}") from None


def difference(want: Term, got: Term, names: tuple[str, str] = ("one", "the other")) -> str:
    """Where two terms first differ (child indices from the root), for a reason."""
    path: list[int] = []
    while want is not got:
        if want.op is not got.op or want.attrs != got.attrs or len(want.args) != len(got.args):
            return (f"at position {path} {names[0]} has {str(want)[:120]} (shape "
                    f"{dict(want.shape)}), {names[1]} {str(got)[:120]} (shape {dict(got.shape)})")
        i = next(i for i, (a, b) in enumerate(zip(want.args, got.args, strict=True)) if a is not b)
        path.append(i)
        want, got = want.args[i], got.args[i]
    return "none"


def _bind_spec(spec: dict[str, Any], terms: list[Term], limits: Limits) -> tuple[Term, str]:
    _only(spec, "spec", "spec")
    kind = _field(spec, "kind", str, "spec")
    text = _field(spec, "text", str, "spec")
    params = _field(spec, "params", dict, "spec")
    _names(params, "spec.params", limits)
    term = _term_ref(spec.get("term"), terms, "spec.term")
    derived, label = derive_spec(kind, text, params, limits)
    if derived is not term:
        raise Rejected(f"spec.term is not the term that spec.text ({label}) denotes: "
                       f"{difference(derived, term, ('the text', 'spec.term'))}")
    return term, label


# -- decoding ------------------------------------------------------------------------------


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise Rejected(f"not valid JSON: key {k[:40]!r} appears twice in one object")
        out[k] = v
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of the float range")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def decode(cert: object, limits: Limits = Limits()) -> Decoded:
    """Parse a certificate (JSON text, bytes, or the parsed object). Raises `Rejected`."""
    if isinstance(cert, bytes | str):
        if len(cert) > limits.max_bytes:
            raise Rejected(f"certificate is {len(cert)} bytes (limit {limits.max_bytes})")
        try:
            cert = json.loads(cert, object_pairs_hook=_pairs, parse_float=_finite,
                              parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise Rejected(f"not valid JSON: {str(e)[:200]}") from None
    fmt = _field(cert, "format", str, "certificate")
    if fmt in OLD_FORMATS:
        raise Rejected(f"format {fmt} does not bind its spec text to its spec term, so it "
                       f"proves nothing about a named spec: re-create the certificate "
                       f"(kernelsat prove, or optimize) to get {FORMAT}")
    if fmt != FORMAT:
        raise Rejected(f"unknown format {fmt[:40]!r} (expected {FORMAT})")
    _only(cert, "certificate", "certificate")
    terms = _terms(_field(cert, "terms", list, "certificate"), limits)
    spec = _field(cert, "spec", dict, "certificate")
    lib = _only(_field(cert, "library", dict, "certificate"), "library", "library")
    final = _only(_field(cert, "final", dict, "certificate"), "final", "final")
    rules: dict[str, str] = {}
    for i, r in enumerate(_field(lib, "rules", list, "library")):
        _only(r, "rule", f"library.rules[{i}]")
        name = _field(r, "name", str, f"library.rules[{i}]")
        text = _field(r, "text", str, f"library.rules[{i}]")
        if "proof" in r:  # the kind is read from the shipped record, never from here
            _field(r, "proof", str, f"library.rules[{i}]")
        if name in rules or len(text) > limits.max_rule_text:
            raise Rejected(f"library.rules[{i}]: duplicate or oversized rule {name[:40]!r}")
        rules[name] = text
    steps = _field(cert, "steps", list, "certificate")
    if len(steps) > limits.max_steps:
        raise Rejected(f"{len(steps)} steps (limit {limits.max_steps})")
    spec_term, label = _bind_spec(spec, terms, limits)
    d = Decoded(
        spec_kind=spec["kind"],
        spec_text=spec["text"],
        spec_params=dict(spec["params"]),
        spec=spec_term,
        spec_label=label,
        library_hash=_field(lib, "hash", str, "library"),
        rules=rules,
        terms=terms,
        raw_steps=steps,
        final=_term_ref(final.get("term"), terms, "final.term"),
    )
    for name, obj, term in (("spec", spec, d.spec), ("final", final, d.final)):
        if _field(obj, "key", str, name) != term.key:
            raise Rejected(f"{name}.key does not match the {name} term")
    return d


def _binding(tag: str, value: Any, where: str, d: Decoded, limits: Limits) -> Any:
    _want(value, VALUE_TAGS[tag], where)
    if tag == "term":
        return _term_ref(value, d.terms, where)
    if tag == "int":
        return _count(value, where, limits, low=-limits.max_size)
    if tag == "float" and not math.isfinite(value):
        raise Rejected(f"{where}: not a finite number")
    return _name(value, where, limits) if tag == "str" else value


def decode_step(
    raw: object, i: int, d: Decoded, limits: Limits = Limits()
) -> tuple[str, Direction, Path, Bindings]:
    """(rule, direction, path, bindings) of step `i`. Raises `Rejected` naming the step."""
    try:
        where = f"steps[{i}]"
        _only(raw, "step", where)
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
        raw_bindings = _field(raw, "bindings", dict, where)
        _names(raw_bindings, f"{where}.bindings", limits)
        for name, tagged in raw_bindings.items():
            ok = isinstance(tagged, dict) and len(tagged) == 1
            if not ok or not tagged.keys() <= VALUE_TAGS.keys():
                raise Rejected(f"{where}: binding ?{str(name)[:40]} must be {{tag: value}}, "
                               f"tag one of {sorted(VALUE_TAGS)}")
            ((tag, value),) = tagged.items()
            here = f"{where}.bindings.{str(name)[:40]}"
            bindings[name] = _binding(tag, value, here, d, limits)
        return rule, direction, tuple(path), bindings
    except Rejected as e:
        raise Rejected(e.reason, i) from None


# -- rules and replay ----------------------------------------------------------------------


def _library_rules(d: Decoded, library: Library) -> dict[str, Rule]:
    if d.library_hash != library.hash:
        raise Rejected("library hash differs from the verified library's")
    out: dict[str, Rule] = {}
    for name, text in d.rules.items():
        verified = library.by_name.get(name)
        if verified is None:
            raise Rejected(f"rule {name[:40]!r} is not in the verified library")
        try:
            parsed = parse_rule(text)
        except Exception as e:  # any failure to parse a rule text is a rejection
            raise Rejected(f"rule {name!r} does not parse: {str(e)[:200]}") from None
        if parsed.name != name or text != verified.text() or parsed.key != verified.key:
            raise Rejected(f"rule {name!r} differs from the verified library's text")
        out[name] = verified
    return out


REPLAY_ERRORS = (RuleError, ShapeError, ValueError, KeyError, TypeError, IndexError,
                 ArithmeticError, RecursionError)


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


@functools.lru_cache(maxsize=1)
def shipped_library() -> RuleSet:
    """The rules of the shipped `.rules` files, hashed as `load_library` hashes them. This
    is the verified library without running a verifier: `load_library` (every optimize
    and prove run) and the test suite verify exactly these files, and a certificate
    names the hash of the rule texts it was made with."""
    return RuleSet(tuple(library_rules()), verified=False)


def check(
    cert: object,
    library: Library | None = None,
    limits: Limits = Limits(),
    *,
    spec: Term | None = None,
    program: Term | None = None,
    spec_name: str = "the given spec",
) -> CheckResult:
    """Check a certificate (JSON text, bytes, parsed object, or anything with `to_json()`)
    against the verified `library` (default: `shipped_library()`, the shipped rule files as
    they are: no verifier runs, no cache is read). With `spec`, the
    certificate must be about that spec term; with `program`, it must prove that one."""
    try:
        if hasattr(cert, "to_json"):
            cert = cert.to_json()
        d = decode(cert, limits)
        if spec is not None and d.spec is not spec:
            raise Rejected(f"the certificate is about {d.spec_label}, not {spec_name}: "
                           f"{difference(spec, d.spec, ('the given spec', 'the certificate'))}")
        rules = _library_rules(d, shipped_library() if library is None else library)
        _replay(d, rules, limits)
        if program is not None and d.final is not program:
            raise Rejected(f"the certificate proves another program than the one given: "
                           f"{difference(program, d.final, ('the given one', 'the proved'))}")
    except Rejected as e:
        return CheckResult(False, e.step, e.reason)
    except Exception as e:  # a bug in the checker or what it trusts: still never accepted
        return CheckResult(False, None, f"internal error while checking ({type(e).__name__}: "
                                        f"{str(e)[:200]}); not accepted, please report it")
    return CheckResult(True, None, f"{len(d.raw_steps)} steps replay from the spec "
                                   f"({d.spec_label}) to the program{_weakest_link(rules)}")


def _weakest_link(rules: Mapping[str, Rule]) -> str:
    """`; weakest link: <proof kind> (<rule>)`, from the shipped record of how each rule
    was proved (not from the certificate), or "" for a chain of no steps."""
    kinds = {shipped_kind(name, rule.key): name for name, rule in rules.items()}
    worst = weakest(kinds)
    return "" if worst is None else f"; weakest link: {worst} ({kinds[worst]})"


# -- stand-alone ---------------------------------------------------------------------------


class UsageError(ValueError):
    """A file named on the command line that cannot be read or parsed."""


def read_text(path: str | FilePath) -> str:
    """A file named on the command line, as UTF-8 text. Raises `UsageError`."""
    try:
        return read_source(path)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:  # not UTF-8: the message names the line, column and byte
        raise UsageError(str(e)) from None


def load_expected(spec_path: str | FilePath, params: Sequence[str] = ()) -> tuple[Term, str]:
    """(term, name) of a spec file the user names: `.ks` at `-p K=V` sizes, or an
    s-expression file (`.sexpr`) holding a term. Raises `UsageError`."""
    text = read_text(spec_path)
    try:
        if str(spec_path).endswith(".sexpr"):
            if params:
                raise UsageError("-p sets sizes of a .ks spec; a .sexpr term has none")
            return parse_term(text, str(spec_path)), str(spec_path)
        prog = parse_spec(text, str(spec_path), parse_params(list(params)))
    except (ValueError, ArithmeticError, RecursionError) as e:
        raise UsageError(str(e)) from None
    sizes = ", ".join(f"{k}={v}" for k, v in prog.params.items())
    return prog.term, f"{spec_path} (kernel {prog.name}({sizes}))"


def verdict(result: CheckResult) -> str:
    """The line `verify` prints: ACCEPTED: ... or REJECTED [at step K]: ..."""
    if result.accepted:
        return f"ACCEPTED: {result.reason}"
    where = f" at step {result.failed_step}" if result.failed_step is not None else ""
    return f"REJECTED{where}: {result.reason}"


def main(argv: Sequence[str] | None = None) -> int:
    """The stand-alone checker: 0 accepted, 1 rejected, 2 a file it cannot use."""
    parser = argparse.ArgumentParser(
        prog="python -m kernelsat.proofs.checker",
        description="Replay a kernelsat certificate against the shipped rule library.")
    parser.add_argument("cert", help="the certificate (.json)")
    parser.add_argument("--spec", help="require the certificate to be about this spec "
                        "(.ks, sized by -p; or a .sexpr term)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="K=V",
                        help="a size parameter of --spec")
    args = parser.parse_args(argv)
    try:
        if args.param and args.spec is None:
            raise UsageError("-p sets the sizes of --spec FILE: name the spec file too")
        expected, name = load_expected(args.spec, args.param) if args.spec else (None, "")
        text = read_text(args.cert)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = check(text, spec=expected, spec_name=name)
    print(verdict(result))
    return 0 if result.accepted else 1


if __name__ == "__main__":
    sys.exit(main())
