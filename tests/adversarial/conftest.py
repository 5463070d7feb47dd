"""Real certificates for the attacks: spec files of `specs/` at small sizes, rewritten by
a random chain of shipped library rules (no e-graph, no z3: the chain is replayed by
`apply_at`, the checker's own step), and written by `make_certificate` as every writer
does."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from kernelsat.ir import Term, postorder
from kernelsat.ops import Op
from kernelsat.proofs.certificate import Certificate, make_certificate
from kernelsat.proofs.checker import shipped_library
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import RuleError, apply_at, subterm
from kernelsat.spec import parse_spec

SPECS = Path(__file__).resolve().parents[2] / "specs"
SMALL: dict[str, dict[str, int]] = {
    "softmax": {"M": 4, "N": 8},
    "rmsnorm": {"M": 2, "N": 8},
    "attention": {"B": 1, "H": 2, "N": 4, "D": 2},
    "matmul": {"M": 2, "N": 4, "K": 8},
}
"""Spec files and the small sizes their certificates are made at."""


def spec_text(name: str) -> str:
    return (SPECS / f"{name}.ks").read_text()


def _paths(t: Term) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    stack: list[tuple[tuple[int, ...], Term]] = [((), t)]
    while stack:
        p, u = stack.pop()
        out.append(p)
        stack.extend(((*p, i), a) for i, a in enumerate(u.args))
    return out


def random_chain(spec: Term, n: int, seed: int) -> tuple[list[Step], Term]:
    """Up to n steps of shipped rules, forward or backward, each at a random position."""
    rng = random.Random(seed)
    rules = shipped_library().rules
    steps: list[Step] = []
    t = spec
    for _ in range(n):
        options: list[tuple[Step, Term]] = []
        for path in _paths(t):
            for rule in rules:
                for direction in ("forward", "backward"):
                    for b in ({"f": 2},) if rule.parameters else ({},):
                        try:
                            u = apply_at(rule, t, path, direction, dict(b))
                        except (RuleError, ValueError):
                            continue
                        if sum(1 for _ in postorder(u)) < 60 and u is not t:
                            step = Step(rule.name, direction, path, dict(b))
                            options.append((step, u))
        if not options:
            break
        step, t = rng.choice(options)
        steps.append(step)
    return steps, t


def certificate(name: str, n_steps: int = 4, seed: int = 0) -> Certificate:
    """A valid certificate for `specs/<name>.ks` at its small sizes."""
    params = SMALL[name]
    program = parse_spec(spec_text(name), f"{name}.ks", params)
    steps, final = random_chain(program.term, n_steps, seed)
    return make_certificate(program.term, program.source, steps, final, shipped_library(),
                            program.params)


def split_certificate() -> Certificate:
    """softmax (M=4, N=8) with its Sum split by 2 and every binding given explicitly: an
    axis (`str`), a factor (`int`) and a term (`term`), so each tag has a position."""
    program = parse_spec(spec_text("softmax"), "softmax.ks", SMALL["softmax"])
    path = next(p for p in _paths(program.term) if subterm(program.term, p).op is Op.SUM)
    bindings = {"a": "n", "f": 2, "x": subterm(program.term, path).args[0]}
    lib = shipped_library()
    final = apply_at(lib.by_name["sum-split"], program.term, path, "forward", dict(bindings))
    steps = [Step("sum-split", "forward", path, bindings)]
    return make_certificate(program.term, program.source, steps, final, lib, program.params)


_CACHE: dict[str, str] = {}


def cert_json(name: str) -> str:
    """The JSON of a valid certificate: a spec of `SMALL`, or "split" (`split_certificate`)."""
    if name not in _CACHE:
        made = split_certificate() if name == "split" else certificate(name)
        _CACHE[name] = made.to_json()
    return _CACHE[name]


class Certs:
    """What the tests get (helpers cannot be imported from a conftest)."""

    SMALL = SMALL
    SPECS = SPECS
    spec_text = staticmethod(spec_text)
    certificate = staticmethod(certificate)
    random_chain = staticmethod(random_chain)

    @staticmethod
    def obj(name: str = "softmax") -> dict[str, Any]:
        """A fresh parsed copy of a valid certificate, to tamper with."""
        out: dict[str, Any] = json.loads(cert_json(name))
        return out

    @staticmethod
    def text(name: str = "softmax") -> str:
        return cert_json(name)


@pytest.fixture(scope="session")
def certs() -> type[Certs]:
    return Certs
