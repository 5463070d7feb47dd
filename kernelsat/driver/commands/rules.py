"""CLI commands of the rules stage: `kernelsat rules [--verify] [--file MORE.rules]`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.driver.commands.backend_options import usable_cache_dir
from kernelsat.proofs.proof_kinds import PROOF_KINDS, kind_class
from kernelsat.proofs.verify import verify_rules
from kernelsat.rewrites.library import library_rules, user_rules
from kernelsat.rewrites.rule import Rule, RuleError, condition_text


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in rows]
    return "\n".join(lines)


def _load(files: list[Path] | None, families: list[str] | None) -> list[Rule]:
    if files:
        return user_rules(files)
    return library_rules(families)


def _scope_counts(results: list[Any]) -> str:
    """`120 for all sizes, 3 up to a bound (sizes<=4, ...), 1 failed`."""
    everywhere = sum(v.all_sizes for v in results)
    bounds = sorted({v.bound for v in results if v.ok and not v.all_sizes})
    bounded = sum(v.ok and not v.all_sizes for v in results)
    failed = sum(not v.ok for v in results)
    parts = [f"{everywhere} proved for all sizes",
             f"{bounded} only up to a bound" + (f" ({'; '.join(bounds)})" if bounds else "")]
    return ", ".join(parts + ([f"{failed} failed"] if failed else []))


def _kind_counts(results: list[Any]) -> str:
    """`by proof kind: 53 all sizes: z3 elementwise, 73 all sizes: lemma chain, 0 bounded`."""
    counts = {k: sum(v.ok and kind_class(v.kind) == k for v in results) for k in PROOF_KINDS}
    return "by proof kind: " + ", ".join(f"{n} {k}" for k, n in counts.items())


def announce_verification(cache_dir: Path | None = None,
                          families: list[str] | None = None) -> None:
    """Before a command verifies the rule library, say on stderr how many rules the
    verification cache does not hold yet: the first run spends seconds proving them,
    and would otherwise be silent."""
    known = verify_rules(library_rules(families), cache_dir, cached_only=True)
    cold = sum(v.status == "unknown" for v in known)
    if cold:
        typer.echo(f"verifying {cold} rules (first run; cached afterwards)...", err=True)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command("rules")
    def rules_cmd(
        verify: Annotated[bool, typer.Option(
            "--verify", help="Verify every rule (cached).")] = False,
        file: Annotated[list[Path] | None, typer.Option(
            "--file", "-f", help="A .rules file of your own: list or verify it instead.")
        ] = None,
        family: Annotated[list[str] | None, typer.Option(
            "--family", help="Only this family of the library (repeatable).")] = None,
        cache_dir: Annotated[Path | None, typer.Option(
            "--cache-dir", help="Verification cache folder (default ~/.cache/kernelsat).")] = None,
        no_cache: Annotated[bool, typer.Option(
            "--no-cache", help="Verify again even when a result is cached.")] = False,
        allow_bounded: Annotated[bool, typer.Option(
            "--allow-bounded", help="Accept rules proved only up to a size bound (by "
            "default every rule must be proved for all sizes).")] = False,
    ) -> None:
        """List the rewrite rules, or machine-check them with --verify.

        The list gives each rule's name, family, conditions and how it was verified;
        --verify proves every rule (through the cache) and exits 1 if any fails (or is
        proved only up to a size bound, without --allow-bounded)."""
        try:
            rules = _load(file, family)
        except (RuleError, OSError, UnicodeDecodeError) as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(1) from None
        with usable_cache_dir(cache_dir) as folder:
            if verify and not no_cache and not file:
                announce_verification(folder, family)
            start = time.perf_counter()
            results = verify_rules(rules, folder, use_cache=not no_cache,
                                   cached_only=not verify)
            total = time.perf_counter() - start
        if not verify:
            rows = [[r.name, r.family, " ".join(condition_text(c) for c in r.conditions) or "-",
                     v.label() if v.ok else "not verified"] for r, v in zip(rules, results,
                                                                          strict=True)]
            typer.echo(_table(rows, ["rule", "family", "conditions", "verified"]))
            typer.echo(f"{len(rules)} rules")
            return
        rows = [[v.rule, r.family, v.method, v.status, v.proved_for(), str(v.instances),
                 f"{v.seconds:.3f}", v.kind or "-"] for r, v in zip(rules, results, strict=True)]
        typer.echo(_table(rows, ["rule", "family", "method", "status", "proved for",
                                 "instances", "seconds", "proof kind"]))
        failed = [v for v in results if not v.ok]
        for v in failed:
            typer.echo(f"\nFAILED {v.rule} ({v.status}):\n    {v.counterexample}")
        refused = [v for v in results if v.ok and not v.all_sizes]  # not loaded by default
        for v in refused:
            what = "ACCEPTED (--allow-bounded)" if allow_bounded else "REFUSED"
            typer.echo(f"\n{what} {v.rule}: proved only up to a bound ({v.bound}), not for "
                       "all sizes" + ("" if allow_bounded else
                                      "; a rule must hold for every size (pass "
                                      "--allow-bounded to accept it anyway)")
                       + (f"\n    why: {v.limit}" if v.limit else ""))
        typer.echo(f"\n{len(results) - len(failed)}/{len(results)} rules verified in "
                   f"{total:.2f} s (sum of per-rule times {sum(v.seconds for v in results):.2f} s;"
                   " cached results keep the time of their first run)")
        typer.echo(_scope_counts(results))
        typer.echo(_kind_counts(results))
        if failed or (refused and not allow_bounded):
            raise typer.Exit(1)
