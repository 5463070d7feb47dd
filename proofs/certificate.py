"""Certificates: the spec, the rules used, the steps and the claimed program, as JSON.

A certificate is self-contained: it carries the full text of every rule it uses and
the hash of the library those rules come from, and every term (the spec, the final
program, term-valued bindings) is stored once in a shared DAG table, so its size is
linear in the number of steps plus the size of the two programs. The spec is bound:
its text (`.ks` source and params, or the term's canonical s-expression) must
re-derive the spec term, here when it is made and in the checker. The format is
documented, and parsed, by the checker (`kernelsat.proofs.checker`): there is one
parser, the trusted one.

>>> from kernelsat.ir import In, Const, mul
>>> from kernelsat.rewrites.rule import parse_rule
>>> from kernelsat.proofs.steps import Step
>>> r = parse_rule("mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]")
>>> class Lib:
...     rules, by_name, hash = [r], {r.name: r}, "h"
>>> x = In("x", (("i", 2),))
>>> steps = [Step("mul-one", "forward", (), {})]
>>> cert = make_certificate(mul(x, Const(1.0)), "", steps, x, Lib())
>>> cert.spec_kind, cert.spec_text
('sexpr', '(mul (In x i:2) (Const 1.0))')
>>> Certificate.from_json(cert.to_json()) == cert
True
>>> ks = "kernel k(N=2)\\nin x[i:N] f32\\nout y[i] = x[i] * 1.0"
>>> make_certificate(mul(x, Const(1.0)), ks, steps, x, Lib(), {"N": 2}).spec_kind
'ks'
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelsat.ir import Term, postorder
from kernelsat.ops import Op
from kernelsat.proofs.checker import (
    FORMAT,
    Library,
    Rejected,
    decode,
    decode_step,
    derive_spec,
    difference,
)
from kernelsat.proofs.proof_kinds import shipped_kind
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import Value, parse_rule
from kernelsat.sexpr import to_sexpr


class CertificateError(ValueError):
    """A certificate that does not parse (the checker's reason is the message)."""


@dataclass(frozen=True)
class Certificate:
    """A proof that `final` equals `spec`: `steps` replayed from `spec` with `rules`
    (name, full text), all from the library whose hash is `library_hash`. `spec` is
    the term that `spec_text` denotes: `.ks` source at `spec_params` (`spec_kind`
    "ks"), or the term's canonical s-expression ("sexpr", no params)."""

    spec_kind: str
    spec_text: str
    spec_params: Mapping[str, int]
    spec: Term
    library_hash: str
    rules: tuple[tuple[str, str], ...]
    steps: tuple[Step, ...]
    final: Term

    def to_obj(self) -> dict[str, Any]:
        """The JSON object (terms as a shared DAG table)."""
        table = _Table()
        spec_i = table.add(self.spec)
        steps = [_step_obj(s, table) for s in self.steps]
        final_i = table.add(self.final)
        return {
            "format": FORMAT,
            "spec": {"kind": self.spec_kind, "text": self.spec_text,
                     "params": dict(self.spec_params), "term": spec_i, "key": self.spec.key},
            "library": {"hash": self.library_hash,
                        "rules": [{"name": n, "text": t,
                                   "proof": shipped_kind(n, parse_rule(t).key)}
                                  for n, t in self.rules]},
            "terms": table.rows,
            "steps": steps,
            "final": {"term": final_i, "key": self.final.key},
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_obj(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, object]) -> Certificate:
        """Parse with the checker's defensive decoder. Raises `CertificateError`."""
        try:
            d = decode(text)
            steps = tuple(Step(*decode_step(raw, i, d)) for i, raw in enumerate(d.raw_steps))
        except Rejected as e:
            raise CertificateError(e.reason) from None
        return cls(d.spec_kind, d.spec_text, d.spec_params, d.spec, d.library_hash,
                   tuple(d.rules.items()), steps, d.final)

    def write(self, path: str | Path) -> None:
        """Write atomically (temp file in the same folder, then rename)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json(indent=None))
                f.write("\n")
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a certificate is for sharing
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @property
    def n_steps(self) -> int:
        return len(self.steps)


class _Table:
    """The shared DAG table: each distinct node once, children before parents."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.index: dict[Term, int] = {}

    def add(self, t: Term) -> int:
        for node in postorder(t):
            if node not in self.index:
                self.index[node] = len(self.rows)
                kids = [self.index[a] for a in node.args]
                self.rows.append([node.op.value, _attrs_obj(node), kids])
        return self.index[t]


def _attrs_obj(t: Term) -> list[Any]:
    if t.op is Op.IN:
        name, dims = t.attrs
        return [name, [[[a, s] for a, s in group] for group in dims]]  # type: ignore[union-attr,str-unpack]
    return list(t.attrs)


_TAGS: tuple[tuple[type, str], ...] = ((Term, "term"), (bool, "bad"), (int, "int"),
                                       (float, "float"), (str, "str"))


def _value_obj(v: Value, table: _Table) -> dict[str, Any]:
    for kind, tag in _TAGS:
        if isinstance(v, kind):
            if tag == "bad":
                break
            return {tag: table.add(v) if isinstance(v, Term) else v}
    raise TypeError(f"cannot store binding value {v!r}")


def _step_obj(s: Step, table: _Table) -> dict[str, Any]:
    return {"rule": s.rule, "direction": s.direction, "path": list(s.path),
            "bindings": {k: _value_obj(v, table) for k, v in sorted(s.bindings.items())}}


def make_certificate(
    spec_term: Term,
    spec_text: str,
    steps: Iterable[Step],
    final: Term,
    ruleset: Library,
    params: Mapping[str, int] | None = None,
) -> Certificate:
    """A certificate for `steps` (from `explain`), with the text of every rule used,
    taken from `ruleset` (anything with `.by_name` and `.hash`, e.g. `load_library()`).

    `spec_text` is the `.ks` source `spec_term` was parsed from (at `params`), or "" for
    a bare term, which is then recorded as its canonical s-expression (its sizes are in
    the term: `params` are not recorded). Raises `CertificateError` when the text does
    not denote `spec_term`: a certificate never claims anything about a term it does not
    tie to its spec."""
    steps = tuple(steps)
    used = sorted({s.rule for s in steps})
    missing = [n for n in used if n not in ruleset.by_name]
    if missing:
        raise CertificateError(f"rules not in the library: {missing}")
    kind, text = ("ks", spec_text) if spec_text else ("sexpr", to_sexpr(spec_term))
    params = dict(params or {}) if spec_text else {}
    try:
        derived, label = derive_spec(kind, text, params)
    except Rejected as e:
        raise CertificateError(e.reason) from None
    if derived is not spec_term:
        raise CertificateError(f"the spec text ({label}) does not denote the spec term: "
                               f"{difference(derived, spec_term, ('the text', 'the term'))}")
    rules = tuple((n, ruleset.by_name[n].text()) for n in used)
    return Certificate(kind, text, params, spec_term, ruleset.hash, rules, steps, final)
