"""Rule verification: every rule is machine-checked, and records how.

- Elementwise rules (only elementwise ops and constants): z3 proves `lhs = rhs` for
  all reals under the side conditions (`proofs.verify_smt`), hence for every shape.
  Method `smt`.
- Rules with reductions, splits, stores or sizes: proved for every size by a chain of
  lemmas about reductions over axes of symbolic size, then one z3 query
  (`proofs.verify_lemmas`). Method `lemmas`.
- A rule the lemmas do not reduce to one real identity is tried by the bounded method:
  z3 proves every entry of every instance up to a bound (`proofs.verify_bounded`).
  Method `bounded`, with the bound: a proof only up to a bound, which does not load
  unless the user allows it.
- Every rule is also run on a few random larger instances by the float64
  interpreter (`proofs.verify_numeric`): a mismatch there fails the rule even when
  z3 proved it (that would be a bug in the trusted base, so it is loud). A bounded
  rule is also run on wide instances whose size bound is itself drawn at random
  from an unpredictable seed (`wide_check`).

Each `Verification` records what it covers (`scope`): `ALL_SIZES` (methods `smt` and
`lemmas`) or `BOUNDED` (sizes up to `bound` only), and how it was proved (`kind`:
`all sizes: z3 elementwise`, `all sizes: lemma chain (sum-fubini, split-reindex)`,
`bounded: sizes<=4, ...`). A rule of the latter scope is refused by `load_library`
unless the user allows it.

A failure carries a counterexample: the variable values (and the shapes, for
bounded rules) where the sides differ, or where one side is defined and the other
is not. Results are cached by rule key in a JSON file (`VerificationCache`), under
a version that hashes the source of every module the verdict depends on (the import
graph of the verifier, `trusted_modules`, which includes `rewrites/rule.py`, the IR,
the op table and the interpreter) and the z3, numpy and Python versions: editing any
of them starts the cache over.

>>> from kernelsat.rewrites.rule import parse_rule
>>> v = verify_rule(parse_rule("mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]"))
>>> v.ok, v.method
(True, 'smt')
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import numpy as np
import z3

from kernelsat.cachefile import cache_dir, read_json_cache, write_json_cache
from kernelsat.proofs.proof_kinds import (
    KIND_BOUNDED,
    KIND_ELEMENTWISE,
    KIND_LEMMAS,
    RECORD,
)
from kernelsat.proofs.verify_bounded import Bounds, verify_bounded
from kernelsat.proofs.verify_lemmas import OutsideFragment, verify_all_sizes
from kernelsat.proofs.verify_numeric import numeric_check, wide_check
from kernelsat.proofs.verify_smt import is_elementwise, verify_elementwise
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import Covers, Rule, RuleError

CACHE_FILE = "rule-verification.json"
NUMERIC_TRIALS = 4

VERIFIER_MODULES = ("kernelsat.proofs.verify",)
"""Where the import graph of the trusted base starts (`trusted_modules`)."""

ALL_SIZES, BOUNDED, UNPROVED = "all sizes", "bounded", "none"
"""What a `Verification` covers (`scope`)."""


def _imports(tree: ast.Module, package: str) -> set[str]:
    """Every `kernelsat` module an import statement of `tree` may name (for `from m
    import x`, both `m` and `m.x`: x may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m == "kernelsat" or m.startswith("kernelsat.")}


def _source_of(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None  # `from m import function`: not a module
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


@functools.cache
def trusted_modules(roots: tuple[str, ...] = VERIFIER_MODULES) -> dict[str, Path]:
    """The source file of every `kernelsat` module a verdict can depend on: the verifier
    modules and everything they import, transitively (imports inside functions too:
    the verifier may run them), plus the `__init__` of every package on the way (its
    top level runs first; what it imports for the API, not for the verifier, is not
    followed)."""
    found: dict[str, Path] = {}
    followed: set[str] = set()
    todo = [(name, True) for name in roots]
    while todo:
        name, follow = todo.pop()
        if name in followed or (name in found and not follow):
            continue
        path = found.get(name) or _source_of(name)
        if path is None:
            continue
        found[name] = path
        parts = name.split(".")
        todo.extend((".".join(parts[:i]), False) for i in range(1, len(parts)))
        if follow:
            followed.add(name)
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            tree = ast.parse(path.read_bytes(), str(path))
            todo.extend((m, True) for m in _imports(tree, package))
    return found


def _read_source(path: Path) -> bytes:
    return path.read_bytes()


def verifier_version() -> str:
    """A hash of everything a verdict depends on: the source of every module in
    `trusted_modules` (the verifier, the side-condition evaluator and constant folding
    in `rewrites/rule.py`, the IR, the op table, the interpreter ...) and the versions
    of z3, numpy and Python. A cached result is reused only by the same trusted base."""
    h = hashlib.sha256()
    for name, path in sorted(trusted_modules().items()):
        h.update(f"{name}\n{len(data := _read_source(path))}\n".encode())
        h.update(data)
    h.update(f"z3 {z3.get_version_string()} numpy {np.__version__} python "
             f"{sys.version}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Verification:
    """How one rule was verified. `method`: `smt` (all reals, every shape) or `bounded`
    (every instance within `bound`); `status`: proved, refuted, unproved (z3 found a
    model the real functions do not confirm, or timed out), or error. `scope`: what a
    proof covers, `ALL_SIZES` (every shape) or `BOUNDED` (sizes up to `bound` only);
    `UNPROVED` when it failed."""

    rule: str
    key: str
    ok: bool
    method: str
    status: str
    bound: str | None = None
    instances: int = 0
    seconds: float = 0.0
    counterexample: str | None = None
    scope: str = UNPROVED
    kind: str = ""
    """How it was proved (see `PROOF_KINDS`); empty when it was not."""
    limit: str | None = None
    """For a rule proved only up to a bound: why no all-sizes proof was found."""

    def label(self) -> str:
        """`smt`, `lemmas` or `bounded(...)`: what `Rule.verified` records."""
        return self.method if self.bound is None else f"{self.method}({self.bound})"

    @property
    def all_sizes(self) -> bool:
        """Proved for every size (not only up to a bound)."""
        return self.ok and self.scope == ALL_SIZES

    def proved_for(self) -> str:
        """In words: `all sizes`, `sizes<=4, split sizes<=8, all factors`, or `-`."""
        if not self.ok:
            return "-"
        return ALL_SIZES if self.scope == ALL_SIZES else str(self.bound)


def verify_rule(rule: Rule, bounds: Bounds | None = None,
                numeric_trials: int = NUMERIC_TRIALS) -> Verification:
    """Verify one rule (no cache). A bounded proof is also tried on `numeric_trials`
    wide random instances whose size bound is itself random (`wide_check`)."""
    bounds = bounds or Bounds()
    start = time.perf_counter()
    try:
        v = _verify(rule, bounds, numeric_trials)
    except (RuleError, ValueError, KeyError) as e:
        v = Verification(rule.name, rule.key, False, "none", "error", counterexample=str(e))
    return Verification(**{**asdict(v), "seconds": round(time.perf_counter() - start, 4)})


def _verify(rule: Rule, bounds: Bounds, numeric_trials: int) -> Verification:
    confirmed = True
    limit = kind = None
    # a `covers` rule's sides have different variables, hence shapes: the lemma method
    # enumerates which axes each variable has and proves the instances the condition admits
    if is_elementwise(rule) and not any(isinstance(c, Covers) for c in rule.conditions):
        out = verify_elementwise(rule)
        ok, status, why, method, bound, count = (out.ok, out.status, out.counterexample, "smt",
                                                 None, 1)
        confirmed, kind = out.confirmed, KIND_ELEMENTWISE
    else:
        ok, status, why, method, bound, count, kind, limit = _verify_tensor(rule, bounds)
    numeric = numeric_check(rule, seed=0, trials=numeric_trials) if numeric_trials else None
    if ok and numeric is None and method == "bounded" and numeric_trials:
        numeric = wide_check(rule)
    if ok and numeric is not None:
        status, ok, why = "inconsistent", False, (
            f"z3 proved the rule but the float64 interpreter disagrees: {numeric}")
    elif not ok and status == "refuted" and method != "lemmas" and not cast(
            str, why).startswith("shape"):  # a lemma refutation is confirmed already
        numeric = numeric or numeric_check(rule, seed=1, trials=4 * numeric_trials)
        if numeric is None and not confirmed:
            status = "unproved"  # z3's model leans on the uninterpreted functions
        why = f"{why}\n    confirmed numerically: {numeric}" if numeric else why
    scope = UNPROVED if not ok else BOUNDED if method == "bounded" else ALL_SIZES
    return Verification(rule.name, rule.key, ok, method, status, bound, count, 0.0, why, scope,
                        (kind or "") if ok else "", limit if ok else None)


def _verify_tensor(rule: Rule, bounds: Bounds) -> tuple[
        bool, str, str | None, str, str | None, int, str | None, str | None]:
    """A rule with reductions, splits, stores or sizes: for all sizes by the lemma chain;
    failing that, up to `bounds` (the reason the lemmas failed is kept as `limit`)."""
    try:
        a = verify_all_sizes(rule)
    except OutsideFragment as e:
        why = f"outside the all-sizes fragment: {e}"
    else:
        if a.ok:
            lemmas = f" ({', '.join(sorted(a.lemmas))})" if a.lemmas else ""
            return True, "proved", None, "lemmas", None, a.instances, KIND_LEMMAS + lemmas, None
        if a.status in ("refuted", "error"):  # confirmed at concrete sizes, or a shape
            return False, a.status, a.counterexample, "lemmas", None, a.instances, None, None
        why = f"not proved for all sizes ({a.status}): {a.counterexample}"
    b = verify_bounded(rule, bounds)
    if b.ok:
        return (True, "proved", None, "bounded", bounds.text(), b.instances,
                f"{KIND_BOUNDED}: {bounds.text()}", why)
    if b.status == "refuted":
        return False, b.status, b.counterexample, "bounded", bounds.text(), b.instances, None, None
    return (False, "unproved", f"{why}\n    bounded ({bounds.text()}): {b.status}: "
            f"{b.counterexample}", "bounded", bounds.text(), b.instances, None, None)


class VerificationCache:
    """Results by rule key, in `<dir>/rule-verification.json`, for one verifier version."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.path = cache_dir(directory) / CACHE_FILE
        self.version = verifier_version()
        self.entries: dict[str, dict[str, object]] = {}
        # damaged: moved aside with a warning; unreadable: skipped with a warning
        data = read_json_cache(self.path, "rule verification cache")
        if isinstance(data, dict) and data.get("version") == self.version:
            rules = data.get("rules", {})
            self.entries = {k: v for k, v in rules.items() if isinstance(v, dict)} if isinstance(
                rules, dict) else {}
        self.dirty = False

    def get(self, rule: Rule) -> Verification | None:
        hit = self.entries.get(rule.key)
        if hit is None:
            return None
        try:
            v = Verification(**hit)  # type: ignore[arg-type]
        except TypeError:  # an entry of another shape: verify again
            return None
        return v if v.key == rule.key else None

    def put(self, v: Verification) -> None:
        self.entries[v.key] = asdict(v)
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        # a read-only cache folder only costs time (and a warning)
        if write_json_cache(self.path, {"version": self.version, "rules": self.entries},
                            "rule verification cache"):
            self.dirty = False


def verify_rules(rules: Iterable[Rule], cache_dir: str | Path | None = None,
                 use_cache: bool = True, cached_only: bool = False) -> list[Verification]:
    """Verify every rule, through the cache. `cached_only`: never verify, report what the
    cache knows (rules it does not know come back with status `unknown`)."""
    cache = VerificationCache(cache_dir)
    out: list[Verification] = []
    for rule in rules:
        hit = cache.get(rule) if use_cache else None
        if hit is None and cached_only:
            hit = Verification(rule.name, rule.key, False, "none", "unknown")
        if hit is None:
            hit = verify_rule(rule)
            cache.put(hit)
        out.append(hit)
    cache.save()
    return out


def write_proof_kinds(path: str | Path | None = None,
                      cache_dir: str | Path | None = None) -> Path:
    """Verify the shipped library and write the record of each rule's proof kind
    (`rewrites/proof-kinds.json`, read by the checker without z3). Raises ValueError
    when a rule does not verify."""
    rules = library_rules()
    results = verify_rules(rules, cache_dir)
    failed = [v.rule for v in results if not v.ok]
    if failed:
        raise ValueError(f"rules do not verify: {failed}")
    target = Path(path) if path is not None else Path(__file__).resolve().parents[1] / (
        "rewrites") / RECORD
    data = {"about": "how each shipped rule is proved (kernelsat rules --verify); written "
                     "by kernelsat.proofs.verify.write_proof_kinds",
            "rules": {v.rule: {"key": v.key, "kind": v.kind} for v in results}}
    target.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return target
