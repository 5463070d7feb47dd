"""The conventions a user expects of an installed tool: a version, `python -m`, shell
completion, help on every option, numeric options checked up front (exit 2 with the
option's name), `--json` that parses, public exceptions, a short repr, and the library's
`optimize` taking a backend by name."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib
import typing
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import typer.main
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

import kernelsat
from kernelsat.cli import app
from kernelsat.driver.commands.rules import announce_verification
from kernelsat.driver.commands.spec import bundled_specs, json_safe
from kernelsat.driver.pipeline import Candidate, OptimizeError, Result
from kernelsat.hardware.targets import get_target
from kernelsat.testing import programs

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = str(ROOT / "specs" / "softmax.ks")
runner = CliRunner()


def _commands() -> dict[str, Any]:
    """Every command of the CLI, by name (click objects, as typer builds them)."""
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def _callbacks() -> dict[str, Any]:
    """The Python function behind each command, by command name."""
    out = {}
    for info in app.registered_commands:
        assert info.callback is not None
        out[info.name or info.callback.__name__.replace("_", "-")] = info.callback
    return out


# -- version, python -m, completion ------------------------------------------------------


def test_version_has_one_source() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert kernelsat.__version__ == metadata.version("kernelsat") == declared
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"kernelsat {declared}"


def test_python_dash_m_is_the_same_cli(tmp_path: Path) -> None:
    version = subprocess.run([sys.executable, "-m", "kernelsat", "--version"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"kernelsat {kernelsat.__version__}"
    helped = subprocess.run([sys.executable, "-m", "kernelsat", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: kernelsat " in helped.stdout  # not "__main__.py"
    for name in ("optimize", "check", "verify"):
        assert name in helped.stdout


def test_shell_completion_is_offered() -> None:
    helped = runner.invoke(app, ["--help"])
    assert "--install-completion" in helped.output and "--show-completion" in helped.output
    # the protocol the installed script speaks (`--show-completion` itself detects the
    # parent shell with shellingham, which fails under some process trees, e.g. CI's)
    script = runner.invoke(app, [], prog_name="kernelsat",
                           env={"_KERNELSAT_COMPLETE": "source_bash"})
    assert script.exit_code == 0
    assert "_KERNELSAT_COMPLETE" in script.output
    words = runner.invoke(app, [], prog_name="kernelsat",
                          env={"_KERNELSAT_COMPLETE": "complete_bash",
                               "COMP_WORDS": "kernelsat opt", "COMP_CWORD": "1"})
    assert words.exit_code == 0
    assert words.output.split() == ["optimize"]


# -- help on every option ----------------------------------------------------------------


def test_every_parameter_of_every_command_has_help() -> None:
    group = typer.main.get_command(app)
    missing = [f"kernelsat {p.name}" for p in group.params if not getattr(p, "help", None)]
    for name, command in _commands().items():
        assert command.help, f"command {name} has no help"
        missing += [f"{name} {'/'.join(p.opts)}" for p in command.params
                    if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"parameters without help text: {missing}"


def test_extract_help_names_every_extractor() -> None:
    from kernelsat.extract import EXTRACTOR_GROUPS

    params = {p.name: p for p in _commands()["optimize"].params}
    for method in EXTRACTOR_GROUPS:
        assert method in params["extract"].help, f"--extract help omits {method}"


def test_shared_option_names_mean_one_thing() -> None:
    short = {"--out": "-o", "--target": "-t", "--param": "-p"}
    for name, command in _commands().items():
        for p in command.params:
            if p.param_type_name != "option" or p.hidden:
                continue
            if "--json" in p.opts:
                assert p.is_flag, f"{name} --json must print JSON, not take a value"
            assert "--cache" not in p.opts, f"{name}: the cache option is --cache-dir"
            for long, letter in short.items():
                if long in p.opts:
                    assert letter in p.opts, f"{name} {long} lacks {letter}"


# -- numeric options: ranges checked before anything runs --------------------------------


def _numeric_options() -> list[tuple[str, str, type, Any]]:
    """(command, python parameter name, int or float, its typer OptionInfo) for every
    numeric option of every command."""
    out = []
    for command, fn in _callbacks().items():
        hints = typing.get_type_hints(fn, include_extras=True)
        for name, hint in hints.items():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, *meta = typing.get_args(hint)
            kinds = [a for a in (typing.get_args(base) or (base,)) if a is not type(None)]
            if kinds in ([int], [float]):
                info = next(m for m in meta if isinstance(m, typer.models.OptionInfo))
                out.append((command, name, kinds[0], info))
    return out


def test_every_numeric_option_states_its_range() -> None:
    options = _numeric_options()
    assert len(options) > 20  # the walk found the options
    loose = [f"{c} {n}" for c, n, kind, info in options
             if (kind is int and info.min is None) or (kind is float and info.callback is None)]
    assert not loose, f"numeric options with no range check: {loose}"


def _invocation(command: str, param: str, value: str) -> list[str]:
    """`command` with its required parameters filled in and `param` set to `value`."""
    args = [command]
    flag = ""
    for p in _commands()[command].params:
        if p.name == param:
            flag = p.opts[0]
        elif p.required:
            args += ["x"] if p.param_type_name == "argument" else [p.opts[0], "x"]
    assert flag, (command, param)
    return [*args, flag, value]


def _bad_values(kind: type, info: Any) -> list[str]:
    if kind is int:  # an option with no minimum is reported by the test above
        return [str(info.min - 1) if info.min is not None else "-1"]
    bad = ["nan", "-inf"]
    if info.min is not None:
        bad.append(str(info.min - 1.0))
    return bad


@pytest.mark.parametrize(("command", "param", "kind", "info"), _numeric_options(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_out_of_range_values_exit_2_naming_the_option(command: str, param: str, kind: type,
                                                      info: Any) -> None:
    for value in _bad_values(kind, info):
        args = _invocation(command, param, value)
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert args[-2] in result.output, (args, result.output)
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "option"), [
    (["optimize", SOFTMAX, "--samples", "-3"], "--samples"),
    (["optimize", SOFTMAX, "--seconds", "nan"], "--seconds"),
    (["optimize", SOFTMAX, "--seconds", "inf"], "--seconds"),
    (["optimize", SOFTMAX, "--sat-seconds", "0"], "--sat-seconds"),
    (["saturate", SOFTMAX, "--seconds", "0"], "--seconds"),
    (["saturate", SOFTMAX, "--factors", "64,x"], "--factors"),
    (["saturate", SOFTMAX, "--factors", "1"], "--factors"),
    (["bench", SOFTMAX, "--knobs", "{not json"], "--knobs"),
    (["train", "--corpus", "c", "--out", "o", "--lr", "0"], "--lr"),
    (["train", "--corpus", "c", "--out", "o", "--max-seconds", "-inf"], "--max-seconds"),
])
def test_named_bad_values_are_refused(args: list[str], option: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


def test_options_validate_refuses_nan_in_the_library() -> None:
    for bad in ({"seconds": math.nan}, {"samples": -3}, {"sat_seconds": math.inf},
                {"seed": -1}):
        with pytest.raises(OptimizeError):
            kernelsat.optimize(SOFTMAX, "numpy", **bad)


# -- --json ------------------------------------------------------------------------------


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_check_json_lists_every_spec() -> None:
    specs = sorted(str(p) for p in (ROOT / "specs").glob("*.ks"))
    result = runner.invoke(app, ["check", "--json", *specs])
    assert result.exit_code == 0, result.output
    records = _strict_json(result.stdout)
    assert [r["path"] for r in records] == specs
    for r in records:
        assert r["ok"] and r["flops"] > 0 and r["min_bytes"] > 0 and r["eager_kernels"] >= 1
        assert len(r["output"]["shape"]) == len(r["output"]["axes"])


def test_check_json_reports_a_bad_spec_and_exits_1() -> None:
    bad = str(ROOT / "tests" / "malformed" / "unknown_input.ks")
    result = runner.invoke(app, ["check", "--json", SOFTMAX, bad])
    assert result.exit_code == 1
    good, failed = _strict_json(result.stdout)
    assert good["ok"] and good["kernel"] == "softmax"
    assert not failed["ok"] and "unknown_input.ks:4:19" in failed["error"]


@pytest.mark.parametrize("target", ["reference", "numpy"])
def test_run_json_parses(target: str) -> None:
    result = runner.invoke(app, ["run", SOFTMAX, "-p", "M=8", "-p", "N=16", "--seed", "3",
                                 "-t", target, "--json"])
    assert result.exit_code == 0, result.output
    data = _strict_json(result.stdout)
    assert data["kernel"] == "softmax" and data["seed"] == 3 and data["target"] == target
    assert data["output"]["shape"] == [8, 16]
    assert 0 <= data["float32"]["relative_l2_error"] < 1e-5
    assert data["float64"]["non_finite"] == 0


_floats = st.floats(allow_nan=True, allow_infinity=True)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _floats | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=20,
)


@given(_values)
def test_json_safe_always_gives_strict_json(value: Any) -> None:
    text = json.dumps(json_safe(value), allow_nan=False)
    _strict_json(text)


@given(_floats)
def test_json_safe_keeps_finite_numbers_and_nulls_the_rest(x: float) -> None:
    assert json_safe({"x": [x]}) == {"x": [x if math.isfinite(x) else None]}


# -- bundled specs, bench --cache-dir, the first-run message -----------------------------


def test_bundled_specs_are_found_by_name_from_any_folder(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert {"softmax", "attention", "matmul"} <= set(bundled_specs())
    result = runner.invoke(app, ["check", "softmax"])
    assert result.exit_code == 0, result.output
    assert "kernel softmax(M=4096, N=1024)" in result.output
    # a file of that name in the working folder wins over the bundled example
    (tmp_path / "softmax.ks").write_text("kernel mine(N=4)\nin x[n:N] f32\nout y[n] = x[n]\n")
    assert "kernel mine(N=4)" in runner.invoke(app, ["check", "softmax.ks"]).output
    missing = runner.invoke(app, ["check", "no_such_kernel"])
    assert missing.exit_code == 1
    assert "not a bundled spec either" in missing.output and "softmax" in missing.output


def test_bench_cache_dir_and_the_old_cache_name(tmp_path: Path) -> None:
    fast = ["-t", "numpy", "-p", "M=4", "-p", "N=8", "--min-runs", "1", "--min-seconds", "0",
            "--warmup", "0"]
    result = runner.invoke(app, ["bench", SOFTMAX, *fast, "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c" / "measure.sqlite").is_file()
    old = runner.invoke(app, ["bench", SOFTMAX, *fast, "--cache", str(tmp_path / "m.sqlite")])
    assert old.exit_code == 0, old.output
    assert (tmp_path / "m.sqlite").is_file()
    assert "--cache " not in runner.invoke(app, ["bench", "--help"]).output


def test_first_verification_is_announced_once(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    announce_verification(tmp_path, ["elementwise"])
    first = capsys.readouterr().err
    assert "verifying" in first and "(first run; cached afterwards)" in first
    args = ["rules", "--verify", "--family", "elementwise", "--cache-dir", str(tmp_path)]
    assert runner.invoke(app, args).exit_code == 0
    announce_verification(tmp_path, ["elementwise"])
    assert capsys.readouterr().err == ""


# -- the library: exceptions, types, repr, backend by name -------------------------------


def test_public_exceptions_are_importable_and_raised() -> None:
    from kernelsat import (
        CertificateError,
        OptimizeError,
        RuleError,
        SExprError,
        ShapeError,
        SpecError,
        UnverifiedRuleError,
    )

    for name in ("CertificateError", "OptimizeError", "OutputError", "RuleError", "SExprError",
                 "ShapeError", "SpecError", "UnverifiedRuleError"):
        assert name in kernelsat.__all__
    assert issubclass(UnverifiedRuleError, RuleError)
    with pytest.raises(SpecError, match=r"<spec>:1:"):
        kernelsat.parse_spec("kernel k(\n")
    with pytest.raises(SExprError):
        from kernelsat.sexpr import parse_term

        parse_term("(add")
    with pytest.raises(ShapeError):
        from kernelsat.ir import In, add

        add(In("x", (("i", 2),)), In("y", (("i", 3),)))
    with pytest.raises(RuleError):
        kernelsat.load_library(["elementwise"], extra=["not a rule"])
    with pytest.raises(CertificateError):
        from kernelsat.proofs.certificate import Certificate

        Certificate.from_json("{}")
    with pytest.raises(OptimizeError, match="unknown target"):
        kernelsat.optimize(SOFTMAX, "tpu")


def test_public_api_return_types_are_declared() -> None:
    from kernelsat.driver.jobs import Backend  # named only for type checkers there

    hints = typing.get_type_hints(kernelsat.optimize, localns={"Backend": Backend})
    assert hints["return"] is Result
    assert hints["backend"] == Backend | str | None
    assert typing.get_type_hints(kernelsat.verify)["return"] is kernelsat.CheckResult
    assert typing.get_type_hints(kernelsat.load_library)["return"] is kernelsat.RuleSet


def _result(term_a: Any, term_b: Any) -> Result:
    program = kernelsat.load_spec(str(ROOT / "specs" / "attention.ks"))
    def heavy(term: Any, methods: list[str], proof: str) -> Candidate:
        return Candidate(term, methods, proof=proof, certificate="c" * 100_000,
                         source="s" * 100_000, knobs=list(range(1000)), error="e" * 1000)

    eager = heavy(program.term, ["eager"], "eager")
    cands = [eager] + [heavy(t, ["greedy-tree", "sample+store"] * 5, "x" * 500)
                       for t in (term_a, term_b) * 50]
    return Result(program, get_target("c"), cands[1], eager, cands, saturation=object(),
                  notes=["n" * 10_000])


@given(programs(), programs())
def test_result_and_candidate_reprs_are_short(a: Any, b: Any) -> None:
    result = _result(a, b)
    assert len(repr(result)) < 600
    assert all(len(repr(c)) < 300 for c in result.candidates)
    assert repr(result).startswith("Result(kernel='attention', target='c', candidates=101")


def test_unknown_backend_name_fails_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelsat.driver.pipeline as pipeline

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pipeline ran with a bad backend")

    monkeypatch.setattr(pipeline, "saturate_program", no_work)
    monkeypatch.setattr(pipeline, "as_program", no_work)
    with pytest.raises(OptimizeError, match="unknown backend 'slurm': expected local or ray"):
        kernelsat.optimize(SOFTMAX, "numpy", backend="slurm")
    import kernelsat.driver.backends as backends

    monkeypatch.setattr(backends, "ray_available", lambda: False)
    with pytest.raises(OptimizeError, match="needs Ray"):
        kernelsat.optimize(SOFTMAX, "numpy", backend="ray")


@pytest.mark.slow
def test_optimize_takes_a_backend_by_name(tmp_path: Path) -> None:
    result = kernelsat.optimize(SOFTMAX, "numpy", params={"M": 8, "N": 16}, backend="local",
                                seconds=30, trials=2, knob_budget=1, extract="greedy",
                                cache_dir=tmp_path)
    assert result.best.proved and result.best.median < math.inf
    assert len(repr(result)) < 600


@pytest.mark.slow
def test_optimize_takes_ray_by_name_and_stops_the_ray_it_started(tmp_path: Path) -> None:
    from kernelsat.driver.backends import ray_available

    if not ray_available():
        pytest.skip("Ray is not installed (the optional `distributed` extra)")
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process")
    result = kernelsat.optimize(SOFTMAX, "numpy", params={"M": 8, "N": 16}, backend="ray",
                                seconds=60, trials=2, knob_budget=1, extract="greedy",
                                cache_dir=tmp_path)
    assert result.best.proved and result.best.median < math.inf
    assert not ray.is_initialized(), "the local Ray instance optimize started must stop"
