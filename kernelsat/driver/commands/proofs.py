"""CLI commands of the proofs stage: `prove` and `verify`.

`kernelsat prove SPEC PROGRAM --out CERT [-p K=V] [--iters/--nodes/--seconds]` saturates
the spec's term together with the program's (both in one e-graph), explains the
program from the spec with the firing log, checks the chain with the independent
checker and writes the certificate atomically. Exit 1 when no chain is found.

`kernelsat verify CERT [--spec FILE -p K=V] [--program FILE]` replays a certificate with
the checker against the verified library (the shipped rule files): ACCEPTED (exit 0) or
REJECTED with the first failing step and why (exit 1); a file it cannot read or parse
exits 2. `--spec` requires the certificate to be about the user's spec at the given
sizes; the certificate's own spec text is re-derived either way. The same check runs
without this CLI: `python -m kernelsat.proofs.checker CERT [--spec FILE] [-p K=V]`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.driver.commands.options import float_option, int_option
from kernelsat.driver.commands.rules import announce_verification
from kernelsat.driver.commands.spec import fail, refuse
from kernelsat.driver.outputs import OutputError, plan_output_file
from kernelsat.egraph.saturate import saturate
from kernelsat.ir import Term, add
from kernelsat.proofs.certificate import Certificate, make_certificate
from kernelsat.proofs.checker import UsageError, check, load_expected, read_text, verdict
from kernelsat.proofs.explain import ExplainError, Stats, explain
from kernelsat.proofs.library import load_library
from kernelsat.rewrites.library import RuleSet
from kernelsat.rewrites.rule import parse_rules
from kernelsat.sexpr import parse_term
from kernelsat.spec import load_spec, parse_params, read_source


def load_rules(rules_file: Path | None) -> RuleSet:
    """The verified library, or the rules of `rules_file` as a (not verified) `RuleSet`,
    for experiments: a certificate records which library hash it was made against."""
    try:
        if rules_file is not None:
            return RuleSet(tuple(parse_rules(read_source(rules_file), str(rules_file))), False)
        announce_verification()
        return load_library()
    except OSError as e:
        fail(f"{rules_file}: cannot read: {e.strerror or e}")
    except ValueError as e:  # RuleError, or not UTF-8 (with line, column and byte)
        fail(str(e))


def _read(path: Path) -> str:
    try:
        return read_source(path)
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror or e}")
    except ValueError as e:  # not UTF-8: names the line, column and byte offset
        fail(str(e))


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command()
    def verify(
        cert: Annotated[Path, typer.Argument(help="A certificate (.json).", show_default=False)],
        spec: Annotated[
            Path | None,
            typer.Option(help="Require the certificate to be about this spec (.ks, sized by "
                         "-p; or a .sexpr term)."),
        ] = None,
        param: Annotated[
            list[str] | None,
            typer.Option("-p", "--param", metavar="K=V", help="A size parameter of --spec."),
        ] = None,
        program: Annotated[
            Path | None, typer.Option(help="Also require the proved program to be this one.")
        ] = None,
        rules: Annotated[
            Path | None, typer.Option(help="Check against a .rules file, not the library.")
        ] = None,
    ) -> None:
        """Replay a certificate with the independent checker: ACCEPTED or REJECTED."""
        try:
            if param and spec is None:
                raise UsageError("-p sets the sizes of --spec FILE: name the spec file too")
            wanted_spec, name = load_expected(spec, param or ()) if spec else (None, "")
            wanted = parse_term(read_text(program), str(program)) if program else None
            text = read_text(cert)
        except ValueError as e:  # UsageError, or the program file's SExprError
            refuse(str(e))
        library = load_rules(rules) if rules is not None else None
        result = check(text, library, spec=wanted_spec, program=wanted, spec_name=name)
        line = verdict(result)
        if result.accepted and rules is not None:
            note = f"ACCEPTED (against the unverified rules of {rules})"
            line = line.replace("ACCEPTED", note, 1)
        typer.echo(line)
        if not result.accepted:
            raise typer.Exit(1)

    @app.command()
    def prove(
        spec: Annotated[Path, typer.Argument(help="A spec file (.ks).", show_default=False)],
        program: Annotated[
            Path, typer.Argument(help="The program, an s-expression file.", show_default=False)
        ],
        out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the certificate.")],
        param: Annotated[
            list[str] | None,
            typer.Option("-p", "--param", metavar="K=V", help="Override a size parameter."),
        ] = None,
        iters: Annotated[int, int_option("Saturation iteration limit.")] = 30,
        nodes: Annotated[int, int_option("Saturation e-node limit.")] = 20_000,
        seconds: Annotated[
            float, float_option("Saturation time limit (s, > 0).", positive=True)
        ] = 10.0,
        rules: Annotated[
            Path | None, typer.Option(help="A .rules file instead of the library.")
        ] = None,
    ) -> None:
        """Prove PROGRAM equal to SPEC: saturate, explain, check, write the certificate."""
        try:  # before any work: never over an input, a folder or through a link
            inputs = [spec, program, *([rules] if rules else [])]
            out = plan_output_file(out, force=True, protect=inputs)
        except OutputError as e:
            fail(f"error: {e}")
        try:
            prog = load_spec(spec, parse_params(param))
            target = parse_term(_read(program), str(program))
        except OSError as e:
            fail(f"{spec}: cannot read: {e.strerror or e}")
        except ValueError as e:
            fail(str(e))
        if dict(target.shape) != dict(prog.term.shape):
            fail(f"the program's shape {dict(target.shape)} differs from the spec's "
                  f"{dict(prog.term.shape)}: they cannot be equal")
        library = load_rules(rules)
        cert, report = prove_terms(prog.term, target, library, prog.source, prog.params,
                                   iters=iters, nodes=nodes, seconds=seconds)
        typer.echo(report)
        if cert is None:
            raise typer.Exit(1)
        cert.write(out)
        typer.echo(f"wrote {out} ({cert.n_steps} steps, {len(cert.rules)} rules)")


def prove_terms(
    spec: Term,
    target: Term,
    library: RuleSet,
    spec_text: str = "",
    params: dict[str, int] | None = None,
    **limits: Any,
) -> tuple[Certificate | None, str]:
    """(certificate or None, report). Saturates spec and target in one e-graph (their sum
    is the e-graph's root, a container only), explains target from spec, and keeps the
    certificate only if the checker accepts it. `spec_text` is the `.ks` source of
    `spec` at `params`, or "" for a bare term (recorded as its s-expression)."""
    t0 = time.perf_counter()
    res = saturate(add(spec, target), list(library.rules), **limits)
    lines = [f"saturation: {res.stop_reason}, {res.n_nodes} e-nodes, "
             f"{len(res.snapshot.firings)} firings, {res.seconds:.2f} s"]
    stats = Stats()
    try:
        steps = explain(res.snapshot, library, spec, target, stats=stats)
    except ExplainError as e:
        lines.append(f"no chain found within the limits: {e}")
        return None, "\n".join(lines)
    cert = make_certificate(spec, spec_text, steps, target, library, params)
    verdict = check(cert, library)
    lines.append(f"explanation: {len(steps)} steps ({stats.visits} visits); "
                 f"checker: {'ACCEPTED' if verdict.accepted else 'REJECTED'} ({verdict.reason}); "
                 f"{time.perf_counter() - t0:.2f} s in all")
    return (cert if verdict.accepted else None), "\n".join(lines)

