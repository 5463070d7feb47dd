"""CLI commands of the spec stage: `check`, `show`, `run`.

Other stages' commands reuse `ParamsOption` (the repeatable `-p K=V`), `load_or_exit`
(parse a spec or print its error and exit 1) and `fail`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import numpy as np
import typer

from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import Term, dag_size, postorder
from kernelsat.program import Program
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import (
    ParsedSpec,
    analyze_spec,
    eager_kernels,
    min_bytes,
    output_dtype,
    parse_params,
    term_flops,
)

ParamsOption = Annotated[
    list[str] | None,
    typer.Option("-p", "--param", metavar="K=V",
                 help="Override a size parameter, e.g. -p N=4096 (repeatable)."),
]
"""The shared `-p K=V` option; pass its value to `parse_params` or `load_or_exit`."""

SpecArg = Annotated[Path, typer.Argument(help="A spec file (.ks).", show_default=False)]

DEFAULT_MAX_ELEMENTS = 1 << 26
"""`run` refuses programs whose largest interpreted intermediate exceeds this (512 MiB at f64)."""


def fail(message: str) -> NoReturn:
    """Print an error to stderr and exit 1 (no traceback)."""
    typer.echo(message, err=True)
    raise typer.Exit(1)


def load_or_exit(path: Path, params: list[str] | None) -> ParsedSpec:
    """Parse `path` with `-p` overrides, or print the `path:line:col` error and exit 1."""
    try:
        overrides = parse_params(params)
        return analyze_spec(path.read_text(), str(path), overrides)
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror or e}")
    except ValueError as e:  # SpecError included
        fail(str(e))


def human(n: float, unit: str) -> str:
    """`1.5e9, "FLOP"` -> `'1.50 GFLOP'`; bytes use binary prefixes."""
    base, prefixes = (1024.0, ["", "Ki", "Mi", "Gi", "Ti"]) if unit == "B" else (
        1000.0, ["", "K", "M", "G", "T"])
    k = 0
    while abs(n) >= base and k < len(prefixes) - 1:
        n, k = n / base, k + 1
    return f"{n:.0f} {prefixes[k]}{unit}" if k == 0 else f"{n:.2f} {prefixes[k]}{unit}"


def _decl(name: str, axes: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(f'{a}:{s}' for a, s in zip(axes, sizes, strict=True))}]"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary(path: str, parsed: ParsedSpec) -> str:
    """The `check` report of one spec."""
    p = parsed.program
    params = ", ".join(f"{k}={v}" for k, v in p.params.items())
    out_sizes = tuple(p.term.shape[a] for a in p.out_axes)
    ins = [f"{_decl(d.name, d.dim_names, d.dims)} {d.dtype}"
           + ("" if d.role == "data" else f" {d.role}") for d in p.inputs]
    flops, nbytes = term_flops(p.term), min_bytes(p)
    stored = len(parsed.intermediates)
    lines = [
        f"{path}: kernel {p.name}({params})",
        f"  inputs:     {'; '.join(ins) or 'none'}",
        f"  output:     {_decl(p.out_name, p.out_axes, out_sizes)} {output_dtype(p)}",
        f"  statements: {len(p.statements)} ({_plural(stored, 'stored intermediate')}; eager "
        f"baseline {_plural(stored + 1, 'kernel')})",
        f"  dag nodes:  {dag_size(p.term)}",
        f"  flops:      {human(flops, 'FLOP')}",
        f"  min bytes:  {human(nbytes, 'B')} (inputs read once, output written once)",
        f"  intensity:  {flops / nbytes:.2f} FLOP/B",
    ]
    return "\n".join(lines)


def _execute(p: Program, program: Term, env: dict[str, np.ndarray], target: str) -> np.ndarray:
    """The output of `program` on `target` in float32 (the interpreter for "reference")."""
    if target == "reference":
        return evaluate_as(program, env, p.out_axes, np.float32).astype(np.float64)
    from kernelsat.codegen import run_program

    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    return run_program(program, p.out_axes, env32, target).astype(np.float64)


def run_report(p: Program, seed: int, target: str = "reference",
               program: Term | None = None) -> str:
    """Evaluate on random inputs in float64 (the spec, by the interpreter) and in float32
    (the spec or `program`, by the interpreter or a code generator); the `run` report."""
    env = random_inputs(p, seed=seed)
    ref = evaluate_as(p.term, env, p.out_axes, np.float64)
    low = _execute(p, program if program is not None else p.term, env, target)
    norm = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(low - ref)) / norm if norm else float(np.linalg.norm(low))
    finite = np.isfinite(ref)
    lines = [
        f"{p.path}: kernel {p.name}, seed {seed}",
        f"  output {p.out_name}[{', '.join(p.out_axes)}] shape {tuple(ref.shape)}",
        f"  float64: min {np.min(ref):.6g}  max {np.max(ref):.6g}  mean {np.mean(ref):.6g}  "
        f"std {np.std(ref):.6g}  non-finite {int(ref.size - finite.sum())}",
        f"  float32 ({target}) vs float64: relative L2 error {err:.3e}  max abs error "
        f"{float(np.max(np.abs(low - ref))) if ref.size else 0.0:.3e}",
    ]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command()
    def check(
        specs: Annotated[list[Path], typer.Argument(help="Spec files (.ks).", show_default=False)],
        param: ParamsOption = None,
    ) -> None:
        """Parse and shape-check specs; print a summary with FLOPs and minimal bytes."""
        failed = False
        for path in specs:
            try:
                parsed = analyze_spec(path.read_text(), str(path), parse_params(param))
            except OSError as e:
                typer.echo(f"{path}: cannot read: {e.strerror or e}", err=True)
                failed = True
                continue
            except ValueError as e:
                typer.echo(str(e), err=True)
                failed = True
                continue
            typer.echo(summary(str(path), parsed))
        if failed:
            raise typer.Exit(1)

    @app.command()
    def show(spec: SpecArg, param: ParamsOption = None) -> None:
        """Print the term as an s-expression and the eager kernels (one per Store, + root)."""
        parsed = load_or_exit(spec, param)
        p = parsed.program
        typer.echo(f"; {spec}: kernel {p.name}")
        typer.echo(to_sexpr(p.term))
        names = {it.store: it.name for it in parsed.intermediates}
        kernels = eager_kernels(p.term, names, p.out_name)
        typer.echo(f"; eager kernels: {len(kernels)}")
        layouts = {it.name: it.axes for it in parsed.intermediates} | {p.out_name: p.out_axes}
        for k, (name, body) in enumerate(kernels, start=1):
            axes = ", ".join(f"{a}:{body.shape[a]}" for a in layouts.get(name, tuple(body.shape)))
            typer.echo(f"; kernel {k}: {name}[{axes}]")
            typer.echo(to_sexpr(body))

    @app.command()
    def run(
        spec: SpecArg,
        param: ParamsOption = None,
        seed: Annotated[int, typer.Option("--seed", help="Random input seed.")] = 0,
        max_elements: Annotated[
            int, typer.Option("--max-elements", help="Refuse if an interpreted value is larger.")
        ] = DEFAULT_MAX_ELEMENTS,
        target: Annotated[str, typer.Option(
            "--target", "-t", help="reference (the interpreter), numpy, c or cuda.")] = "reference",
        program: Annotated[Path | None, typer.Option(
            "--program", help="Run this s-expression program instead of the spec.")] = None,
    ) -> None:
        """Evaluate on random inputs in float64 and float32; print error and statistics.

        The float64 reference is the spec by the interpreter; the float32 run is the spec
        (or --program) by the interpreter or the target's generated code. Shrink big
        specs with -p."""
        p = load_or_exit(spec, param).program
        if target not in ("reference", "numpy", "c", "cuda"):
            fail(f"unknown target {target!r}; expected reference, numpy, c or cuda")
        term = None
        if program is not None:
            from kernelsat.sexpr import parse_term

            try:
                term = parse_term(program.read_text(), str(program))
            except (OSError, ValueError) as e:
                fail(f"{program}: {e}")
            if dict(term.shape) != dict(p.term.shape):
                fail(f"{program}: shape {dict(term.shape)} differs from the spec's "
                     f"{dict(p.term.shape)}")
        if target == "cuda":
            from kernelsat.codegen import lower, render
            from kernelsat.codegen.cuda import compile_cuda, find_nvcc

            source = render(lower(term or p.term, p.out_axes), None, target="cuda")
            if find_nvcc() is None:
                fail("no GPU here and no nvcc: nothing to run or compile for cuda")
            report = compile_cuda(source)
            typer.echo(f"no GPU on this machine: CUDA source compiled with nvcc for sm_90: "
                       f"{'ok' if report.ok else 'FAILED'}; nothing was run")
            raise typer.Exit(0 if report.ok else 1)
        biggest = max(postorder(p.term), key=lambda n: n.size())
        if biggest.size() > max_elements:
            fail(f"{spec}: the interpreter would hold {biggest.size()} elements "
                 f"({'x'.join(map(str, biggest.shape.values()))}) in one value, over "
                 f"--max-elements {max_elements}; expected smaller sizes "
                 f"(-p K=V over {', '.join(p.params) or 'no parameters'}) or a larger limit")
        typer.echo(run_report(p, seed, target, term))
