"""The trusted base of rule verification: the facts about transcendental functions
that every proof may use, each a textbook identity over the reals.

z3 sees `exp log sqrt tanh erf` as uninterpreted functions. It is never given a
quantified axiom (those make it time out): the normalizer (`proofs.normalize`)
rewrites with oriented instances of the identities marked `rewrite`, and the
identities marked `instance` are asserted for every application that remains in a
formula (`instances`). The other elementwise ops are not uninterpreted: the op
table's `OpInfo.sym` defines them from the others (`sigmoid(x) = 1 / (1 + exp(-x))`,
`softplus(x) = log(1 + exp(x))`, `relu`, `abs`), the values the float64 interpreter
computes (a test checks each definition against it).

Besides these, the trusted base is: z3's real arithmetic, the AC/constant
canonicalization in `proofs.normalize`, the symbolic semantics of each op in
`proofs.verify_sym`, the instance enumeration in `proofs.verify_bounded`, and the
side-condition evaluator and exact constant folding in `rewrites/rule.py`. The
verification cache is keyed on the source of all of them (`proofs.verify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import z3

from kernelsat.ops import UNINTERPRETED


@dataclass(frozen=True)
class Axiom:
    """One trusted identity: where it holds, and how the verifier uses it."""

    name: str
    statement: str
    use: Literal["rewrite", "instance"]
    note: str


AXIOMS: tuple[Axiom, ...] = (
    Axiom("exp-zero", "exp(0) = 1", "rewrite", "definition of exp"),
    Axiom("exp-add", "exp(a + b) = exp(a) * exp(b)", "rewrite", "the functional equation of exp"),
    Axiom("exp-neg", "exp(-a) = 1 / exp(a)", "rewrite", "from exp-add and exp-zero"),
    Axiom("exp-log", "exp(log a) = a  for a > 0", "rewrite",
          "log is the inverse of exp on (0, inf)"),
    Axiom("log-exp", "log(exp a) = a", "rewrite", "exp is injective, log its inverse"),
    Axiom("log-one", "log(1) = 0", "rewrite", "from exp-zero and log-exp"),
    Axiom("log-mul", "log(a * b) = log(a) + log(b)  for a, b > 0", "rewrite",
          "from exp-add and exp-log"),
    Axiom("log-recip", "log(1 / a) = -log(a)  for a > 0", "rewrite", "from exp-neg and exp-log"),
    Axiom("exp-monotone", "exp(max(a, b)) = max(exp a, exp b), likewise min", "rewrite",
          "exp is strictly increasing"),
    Axiom("log-monotone", "log(max(a, b)) = max(log a, log b)  for a, b > 0, likewise min",
          "rewrite", "log is strictly increasing on (0, inf)"),
    Axiom("exp-positive", "exp(a) > 0", "instance", "range of exp"),
    Axiom("tanh-erf-zero", "tanh(0) = 0, erf(0) = 0", "instance", "odd functions"),
    Axiom("sin-cos-range", "-1 <= sin(a) <= 1, -1 <= cos(a) <= 1, sin(0) = 0, cos(0) = 1",
          "instance", "the unit circle"),
    Axiom("sqrt-def", "sqrt(a) >= 0 and sqrt(a) * sqrt(a) = a  for a >= 0", "instance",
          "definition of the principal square root"),
)
"""Every fact about `exp log sqrt tanh erf` the verifier trusts. The `instance` axioms
exp-zero and log-one are also asserted per application (they keep z3's counterexamples
close to the real functions)."""

FUNCTIONS = tuple(sorted(op.value for op in UNINTERPRETED))
"""The functions z3 sees uninterpreted: the op table's `uninterpreted` ops."""


def function(name: str, ctx: z3.Context) -> z3.FuncDeclRef:
    """The uninterpreted z3 function standing for `name`, in the context `ctx`."""
    if name not in FUNCTIONS:
        raise KeyError(name)
    return z3.Function(name, z3.RealSort(ctx), z3.RealSort(ctx))


def instances(name: str, arg: z3.ArithRef, app: z3.ArithRef) -> list[z3.BoolRef]:
    """The `instance` axioms for one application `app = name(arg)`."""
    match name:
        case "exp":
            return [app > 0, z3.Implies(arg == 0, app == 1)]  # exp-positive, exp-zero
        case "sqrt":
            return [app >= 0, z3.Implies(arg >= 0, app * app == arg)]  # sqrt-def
        case "log":
            return [z3.Implies(arg == 1, app == 0)]  # log-one
        case "tanh" | "erf":
            return [z3.Implies(arg == 0, app == 0)]  # tanh(0) = erf(0) = 0
        case "sin" | "cos":  # sin-cos-range
            at_zero = 0 if name == "sin" else 1
            return [app >= -1, app <= 1, z3.Implies(arg == 0, app == at_zero)]
    raise AssertionError(name)
