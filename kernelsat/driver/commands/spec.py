"""CLI commands of the spec stage: `check`, `show`, `run`.

Other stages' commands reuse `ParamsOption` (the repeatable `-p K=V`), `SpecArg`,
`resolve_spec` (a path, or the name of a bundled example spec), `load_or_exit` (parse a
spec or print its error and exit 1), `fail` (exit 1) and `refuse` (a usage error, exit 2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import numpy as np
import typer

from kernelsat.codegen import lower, render, run_program
from kernelsat.codegen.cuda import compile_cuda, find_nvcc
from kernelsat.driver.commands.options import int_option, seed_option
from kernelsat.hardware.targets import get_target, target_names
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as, plan
from kernelsat.ir import Term, dag_size
from kernelsat.memory import refuse_reason, run_estimate
from kernelsat.program import Program
from kernelsat.sexpr import read_program, to_sexpr
from kernelsat.spec import (
    ParsedSpec,
    analyze_spec,
    eager_kernels,
    min_bytes,
    output_dtype,
    parse_params,
    read_source,
    term_flops,
)

ParamsOption = Annotated[
    list[str] | None,
    typer.Option("-p", "--param", metavar="K=V",
                 help="Override a size parameter, e.g. -p N=4096 (repeatable)."),
]
"""The shared `-p K=V` option; pass its value to `parse_params` or `load_or_exit`."""

SpecArg = Annotated[Path, typer.Argument(
    help="A spec file (.ks), or the name of a bundled example (softmax, attention, ...).",
    show_default=False)]
"""The spec argument; pass its value through `resolve_spec` (done by `load_or_exit`)."""

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]


DEFAULT_MAX_ELEMENTS = 1 << 26
"""`run` refuses programs whose largest interpreted intermediate exceeds this (512 MiB at f64)."""


def fail(message: str) -> NoReturn:
    """Print an error to stderr and exit 1 (no traceback)."""
    typer.echo(message, err=True)
    raise typer.Exit(1)


def refuse(message: str) -> NoReturn:
    """A command-line argument that cannot be used: say why and exit 2 (usage error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def bundled_specs() -> dict[str, Path]:
    """The example specs installed with kernelsat, by name (`softmax` -> its `.ks` file)."""
    try:
        folder = resources.files("kernelsat.specs")
    except ModuleNotFoundError:  # an install without the examples
        return {}
    return {Path(f.name).stem: Path(str(f)) for f in folder.iterdir() if f.name.endswith(".ks")}


def resolve_spec(path: Path) -> Path:
    """`path` itself when it exists or names a folder; otherwise the bundled example of
    that name (`softmax` or `softmax.ks`), so an installed kernelsat runs its examples from
    any folder. A path that is neither comes back unchanged (reading it reports the error)."""
    if path.exists() or path.parent != Path(".") or path.suffix not in ("", ".ks"):
        return path
    return bundled_specs().get(path.stem, path)


def _read_spec(path: Path, params: list[str] | None) -> ParsedSpec:
    """Parse `path` (or the bundled spec of that name); raises OSError or ValueError."""
    resolved = resolve_spec(path)
    try:
        text = read_source(resolved)  # UTF-8, a BOM allowed; bad bytes: a SpecError
    except FileNotFoundError as e:
        names = ", ".join(sorted(bundled_specs())) or "none installed"
        raise FileNotFoundError(e.errno, f"{e.strerror}; not a bundled spec either "
                                         f"(bundled: {names})") from None
    return analyze_spec(text, str(resolved), parse_params(params))


def load_or_exit(path: Path, params: list[str] | None) -> ParsedSpec:
    """Parse `path` (or the bundled spec of that name) with `-p` overrides, or print the
    `path:line:col` error and exit 1."""
    try:
        return _read_spec(path, params)
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
    """`X[i:4, j:8]`; a keepdim dim (axis "1") prints as `1`."""
    dims = ("1" if a == "1" else f"{a}:{s}" for a, s in zip(axes, sizes, strict=True))
    return f"{name}[{', '.join(dims)}]"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_json(path: str, parsed: ParsedSpec) -> dict[str, Any]:
    """The `check --json` record of one spec (the figures of `summary`)."""
    p = parsed.program
    flops, nbytes = term_flops(p.term), min_bytes(p)
    stored = len(parsed.intermediates)
    return {
        "path": path, "ok": True, "kernel": p.name, "params": dict(p.params),
        "inputs": [{"name": d.name, "axes": list(d.dim_names), "shape": list(d.dims),
                    "dtype": d.dtype, "role": d.role} for d in p.inputs],
        "output": {"name": p.out_name, "axes": list(p.out_layout),
                   "shape": list(p.out_shape), "dtype": output_dtype(p)},
        "statements": len(p.statements), "stored_intermediates": stored,
        "eager_kernels": stored + 1, "dag_nodes": dag_size(p.term), "flops": flops,
        "min_bytes": nbytes, "intensity": flops / nbytes if nbytes else None,
    }


def summary(path: str, parsed: ParsedSpec) -> str:
    """The `check` report of one spec."""
    p = parsed.program
    params = ", ".join(f"{k}={v}" for k, v in p.params.items())
    ins = [f"{_decl(d.name, d.dim_names, d.dims)} {d.dtype}"
           + ("" if d.role == "data" else f" {d.role}") for d in p.inputs]
    flops, nbytes = term_flops(p.term), min_bytes(p)
    stored = len(parsed.intermediates)
    lines = [
        f"{path}: kernel {p.name}({params})",
        f"  inputs:     {'; '.join(ins) or 'none'}",
        f"  output:     {_decl(p.out_name, p.out_layout, p.out_shape)} {output_dtype(p)}",
        f"  statements: {len(p.statements)} ({_plural(stored, 'stored intermediate')}; eager "
        f"baseline {_plural(stored + 1, 'kernel')})",
        f"  dag nodes:  {dag_size(p.term)}",
        f"  flops:      {human(flops, 'FLOP')}",
        f"  min bytes:  {human(nbytes, 'B')} (inputs read once, output written once)",
        f"  intensity:  {flops / nbytes:.2f} FLOP/B",
    ]
    return "\n".join(lines)


def _execute(p: Program, program: Term, env: dict[str, np.ndarray], backend: str,
             cflags: Sequence[str] = ()) -> np.ndarray:
    """The output of `program` in float32 by a codegen `backend` (the interpreter for
    "reference"; C built for the instruction set `cflags`, a target's `compile_flags`)."""
    if backend == "reference":
        return evaluate_as(program, env, p.out_axes, np.float32).astype(np.float64)

    env32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v  # labels stay int32
             for k, v in env.items()}
    return run_program(program, p.out_axes, env32, backend, cflags=cflags).astype(np.float64)


def run_stats(p: Program, seed: int, backend: str = "reference",
              program: Term | None = None, cflags: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate on random inputs in float64 (the spec, by the interpreter) and in float32
    (the spec or `program`, by the interpreter or a code generator): the `run` figures."""
    env = random_inputs(p, seed=seed)
    ref = evaluate_as(p.term, env, p.out_axes, np.float64)
    low = _execute(p, program if program is not None else p.term, env, backend, cflags)
    norm = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(low - ref)) / norm if norm else float(np.linalg.norm(low))
    return {
        "path": p.path, "kernel": p.name, "seed": seed, "target": backend,
        "output": {"name": p.out_name, "axes": list(p.out_layout), "shape": list(p.out_shape)},
        "float64": {"min": float(np.min(ref)), "max": float(np.max(ref)),
                    "mean": float(np.mean(ref)), "std": float(np.std(ref)),
                    "non_finite": int(ref.size - np.isfinite(ref).sum())},
        "float32": {"relative_l2_error": err,
                    "max_abs_error": float(np.max(np.abs(low - ref))) if ref.size else 0.0},
    }


def run_report(p: Program, seed: int, backend: str = "reference",
               program: Term | None = None, cflags: Sequence[str] = ()) -> str:
    """The `run` report: `run_stats` as text."""
    s = run_stats(p, seed, backend, program, cflags)
    f64, f32, out = s["float64"], s["float32"], s["output"]
    lines = [
        f"{p.path}: kernel {p.name}, seed {seed}",
        f"  output {out['name']}[{', '.join(out['axes'])}] shape {tuple(out['shape'])}",
        f"  float64: min {f64['min']:.6g}  max {f64['max']:.6g}  mean {f64['mean']:.6g}  "
        f"std {f64['std']:.6g}  non-finite {f64['non_finite']}",
        f"  float32 ({backend}) vs float64: relative L2 error {f32['relative_l2_error']:.3e}  "
        f"max abs error {f32['max_abs_error']:.3e}",
    ]
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """`value` with every nan or infinite float replaced by None (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def echo_json(value: Any) -> None:
    """Print `value` as strict JSON (non-finite floats as null) on stdout."""
    typer.echo(json.dumps(json_safe(value), indent=2, allow_nan=False))


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command()
    def check(
        specs: Annotated[list[Path], typer.Argument(
            help="Spec files (.ks) or names of bundled examples.", show_default=False)],
        param: ParamsOption = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Parse and shape-check specs; print a summary with FLOPs and minimal bytes.

        With --json, a list with one record per spec (`ok` false and `error` for a spec
        that does not parse); errors also go to stderr. Exit 1 if any spec fails."""
        failed = False
        records: list[dict[str, Any]] = []
        for path in specs:
            try:
                parsed = _read_spec(path, param)
            except (OSError, ValueError) as e:  # SpecError is a ValueError
                message = f"{path}: cannot read: {e.strerror or e}" if isinstance(
                    e, OSError) else str(e)
                typer.echo(message, err=True)
                records.append({"path": str(path), "ok": False, "error": message})
                failed = True
                continue
            if as_json:
                records.append(summary_json(parsed.program.path, parsed))
            else:
                typer.echo(summary(parsed.program.path, parsed))
        if as_json:
            echo_json(records)
        if failed:
            raise typer.Exit(1)

    @app.command()
    def show(spec: SpecArg, param: ParamsOption = None) -> None:
        """Print the term as an s-expression and the eager kernels (one per Store, + root)."""
        parsed = load_or_exit(spec, param)
        p = parsed.program
        typer.echo(f"; {p.path}: kernel {p.name}")
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
        seed: Annotated[int, seed_option("Random input seed.")] = 0,
        max_elements: Annotated[int, int_option(
            "Refuse if an interpreted value has more elements than this.")
        ] = DEFAULT_MAX_ELEMENTS,
        target: Annotated[str, typer.Option(
            "--target", "-t", help="reference (the interpreter), numpy, c, cuda (the default "
                                   "GPU) or a GPU of `kernelsat targets`.")] = "reference",
        program: Annotated[Path | None, typer.Option(
            "--program", help="Run this s-expression program instead of the spec.")] = None,
        as_json: JsonFlag = False,
    ) -> None:
        """Evaluate on random inputs in float64 and float32; print error and statistics.

        The float64 reference is the spec by the interpreter; the float32 run is the spec
        (or --program) by the interpreter or the target's generated code. Shrink big
        specs with -p. With --json the same figures as one JSON object (nan and inf as
        null)."""
        p = load_or_exit(spec, param).program
        try:
            hw = None if target == "reference" else get_target(target)
        except KeyError:
            fail(f"unknown target {target!r}; expected reference, {', '.join(target_names())}")
        backend = "reference" if hw is None else hw.backend
        term = None
        if program is not None:
            try:
                term = read_program(program)
            except OSError as e:
                fail(f"{program}: cannot read: {e.strerror or e}")
            except ValueError as e:  # names the file, line and column
                fail(str(e))
            if dict(term.shape) != dict(p.term.shape):
                fail(f"{program}: shape {dict(term.shape)} differs from the spec's "
                     f"{dict(p.term.shape)}")
        if hw is not None and hw.kind == "gpu":
            if hw.backend != "cuda":
                fail(f"target {hw.name}: no {hw.backend} code generation yet")
            source = render(lower(term or p.term, p.out_axes), None, hw.backend, arch=hw.arch)
            if find_nvcc() is None:
                fail(f"no GPU here and no nvcc: nothing to run or compile for {target}")
            report = compile_cuda(source, hw.arch)
            if as_json:
                echo_json({"path": p.path, "kernel": p.name, "target": target, "ran": False,
                           "compiled": report.ok, "arch": hw.arch})
            else:
                typer.echo(f"no GPU on this machine: CUDA source compiled with nvcc for "
                           f"{hw.arch}: {'ok' if report.ok else 'FAILED'}; nothing was run")
            raise typer.Exit(0 if report.ok else 1)
        shrink = f"(-p K=V over {', '.join(p.params) or 'no parameters'})"
        biggest = max(plan(p.term).order, key=lambda n: n.size())  # products are contracted
        if biggest.size() > max_elements:
            fail(f"{p.path}: the interpreter would hold {biggest.size()} elements "
                 f"({'x'.join(map(str, biggest.shape.values()))}) in one value, over "
                 f"--max-elements {max_elements}; expected smaller sizes {shrink} or a "
                 "larger limit")
        too_big = refuse_reason(run_estimate(p, backend, term))
        if too_big:
            fail(f"{p.path}: {too_big}\n  expected smaller sizes {shrink}")
        cflags = hw.compile_flags if hw is not None else ()  # c-x86-64-v2: its own ISA
        if as_json:
            echo_json(run_stats(p, seed, backend, term, cflags))
        else:
            typer.echo(run_report(p, seed, backend, term, cflags))
