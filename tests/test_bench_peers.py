"""The pure parts of the peer benchmark (bench/peers.py), the cliff check (bench/cliff.py)
and their shared pieces (bench/harness.py): ratios, the geometric mean, the tables, the
targets, torch_peer's JSON, argument errors. No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cliff  # noqa: E402
import harness  # noqa: E402
import peers  # noqa: E402
from peers import Row, Side, Target  # noqa: E402

TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
positive = st.floats(1e-6, 1e6, allow_nan=False, allow_infinity=False)


def side(ms: float) -> Side:
    return Side(ms / 1e3, ms / 1e3 * 0.9, ms / 1e3 * 1.1, True)


def row(spec: str, ks_ms: float, sizes: str = "N=8", extra: bool = False, **peer_ms: float
        ) -> Row:
    return Row(spec, sizes, side(ks_ms), {k: side(v) for k, v in peer_ms.items()},
               roofline_s=ks_ms / 2e3, eager_c=ks_ms / 1e3, optimize_s=10.0, kernels="1->1",
               chosen_by="eager", extra=extra)


# -- arithmetic ----------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(positive, min_size=1, max_size=12))
def test_geomean_lies_between_min_and_max_and_inverts(xs: list[float]) -> None:
    g = harness.geomean(xs)
    assert min(xs) * (1 - 1e-9) <= g <= max(xs) * (1 + 1e-9)
    assert harness.geomean([1 / x for x in xs]) == pytest.approx(1 / g, rel=1e-9)


def test_geomean_skips_what_did_not_run() -> None:
    assert harness.geomean([2.0, 8.0, math.nan, math.inf, 0.0, -1.0]) == pytest.approx(4.0)
    assert math.isnan(harness.geomean([]))
    assert math.isnan(harness.geomean([math.nan]))


@settings(max_examples=50, deadline=None)
@given(positive, positive)
def test_ratio(a: float, b: float) -> None:
    assert peers.ratio(a, b) == pytest.approx(a / b)
    for bad in (math.nan, math.inf, 0.0, -1.0):
        assert math.isnan(peers.ratio(a, bad)) and math.isnan(peers.ratio(bad, b))


def test_best_peer_is_the_fastest_that_passed() -> None:
    r = row("softmax", 2.0, numpy=3.0, eager=1.0, compile=4.0)
    r.peers["eager"] = Side(failure="run 0: rel. error 0.5")  # the fastest failed its check
    assert r.best_peer() == ("numpy", pytest.approx(3e-3))
    assert r.ratio() == pytest.approx(1.5)  # best peer / kernelsat: kernelsat faster
    assert r.ratio(("compile",)) == pytest.approx(2.0)
    assert math.isnan(r.ratio(("sdpa",)))  # no such peer in this row
    assert r.peer_ratio("compile") == pytest.approx(2.0)
    failed = Row("softmax", "N=8", Side(failure="boom"), {"numpy": side(1.0)})
    assert math.isnan(failed.ratio()) and math.isnan(failed.roofline)


def test_percent_never_shows_a_small_fraction_as_zero() -> None:
    assert peers.percent(0.456) == "46%"
    assert peers.percent(0.004) == "0.4%"
    assert peers.percent(math.nan) == "—"


# -- torch_peer's JSON -------------------------------------------------------------------


def payload(spec: str = "softmax") -> dict[str, object]:
    t = {"median": 0.002, "q1": 0.0019, "q3": 0.0021, "runs": 10, "rel_err": 1e-7, "ok": True,
         "failure": "", "compile_s": math.nan}
    bad = {**t, "median": math.nan, "ok": False, "failure": "run 3: rel. error 0.1"}
    return {"torch": "2.13.0", "threads": 2, "rows": [
        {"spec": spec, "params": {"M": 4}, "sides": {"eager": t, "compile": bad}}]}


def test_torch_sides_reads_every_side() -> None:
    text = json.dumps(payload())  # NaN travels as JSON's NaN, as json.dumps writes it
    sides = peers.torch_sides(json.loads(text), "softmax")
    assert sides["eager"] == Side(0.002, 0.0019, 0.0021, True, "")
    assert not sides["compile"].ok and "rel. error" in sides["compile"].failure
    assert sides["compile"].cell().startswith("fails: run 3")


def test_torch_sides_refuses_a_missing_or_malformed_row() -> None:
    with pytest.raises(ValueError, match="0 rows for 'layernorm'"):
        peers.torch_sides(payload(), "layernorm")
    broken = payload()
    broken["rows"][0]["sides"]["eager"] = {"ok": True}  # type: ignore[index]
    with pytest.raises(ValueError, match="side 'eager'"):
        peers.torch_sides(broken, "softmax")


# -- tables and targets ------------------------------------------------------------------


def test_spec_table_has_a_line_per_row_and_says_what_failed() -> None:
    rows = [row("softmax", 2.0, numpy=3.0), row("attention", 10.0, "N=2048", True, sdpa=5.0),
            Row("matmul", "M=8", Side(failure="optimize raised OptimizeError: x"))]
    text = peers.spec_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "1.50x (numpy)" in lines[2] and "50%" in lines[2]
    assert "attention (extra size)" in lines[3] and "0.50x (SDPA)" in lines[3]
    assert "fails: optimize raised" in lines[4]


def test_target_verdicts() -> None:
    assert "| yes | 1.50x margin |" in Target("x", "t", 1.5, 1.0).line()
    assert "| **no** | 2.00x short |" in Target("x", "t", 0.5, 1.0).line()
    assert "| not measured |" in Target("x", "t", math.nan, 1.0).line()
    assert Target("x", "t", 1.0, 1.0).met  # reaching the target exactly meets it


def test_targets_follow_the_issue() -> None:
    rows = [
        row("attention", 10.0, sdpa=8.0),  # slower than SDPA: missed
        row("attention", 50.0, "N=4096", True, sdpa=60.0),  # faster: met
        row("matmul", 10.0, numpy=9.5),  # 0.95x numpy's speed: met (needs 0.9x)
        row("swiglu", 10.0, numpy=12.0, compile=9.0),  # slower than torch.compile: missed
        row("softmax", 1.05, numpy=2.0, eager=1.0, compile=3.0),  # 1.05x the best: met
        row("elementwise", 10.0, compile=15.0),  # 1.5x, needs 2x: missed
    ]
    lines = {t.what + " | " + t.target: t for t in peers.targets(rows)}
    got = {k: t.met for k, t in lines.items()}
    assert got["attention N=8 | faster than torch SDPA"] is False
    assert got["attention N=4096 | faster than torch SDPA"] is True
    assert got["matmul N=8 | ≥ 0.9x numpy's speed"] is True
    assert got["swiglu | faster than numpy and torch.compile"] is False
    assert got["softmax | ≤ 1.1x the best of numpy, torch eager, torch.compile"] is True
    assert got["elementwise | ≥ 2x faster than torch.compile"] is False
    # specs that did not run get no line; the extra size stays out of the geomean
    assert not any(k.startswith(("layernorm", "bmm")) for k in lines)
    geo = next(t for k, t in lines.items() if k.startswith("geomean"))
    assert geo.what == "geomean over 5 specs"
    torch_best = [8 / 10, 9 / 10, 1 / 1.05, 15 / 10]  # matmul has no torch figure
    assert geo.value == pytest.approx(harness.geomean(torch_best))


def test_markdown_has_the_command_probes_table_geomean_and_targets() -> None:
    probe = {"when": "2026-01-01T00:00:00", "cpu": "Xeon", "cores": 2, "load_avg_1m": 0.5,
             "matmul_gflops": 200, "peak_fp32_gflops": 332.8, "triad_gb_s": 30,
             "triad_engine": "c-openmp"}
    text = peers.markdown([row("softmax", 2.0, numpy=4.0), row("rowsum", 1.0, numpy=1.0)],
                          "python bench/peers.py --only softmax rowsum", "Threads: 2.",
                          probe, probe)
    assert text.startswith("Command: `python bench/peers.py --only softmax rowsum`")
    assert "Machine probe before: 2026-01-01T00:00:00 Xeon x2, load 0.50" in text
    assert f"over 2 specs (extra sizes left out): **{math.sqrt(2):.2f}x**" in text
    assert "| what | target | measured | met? | by how much |" in text


# -- arguments ----------------------------------------------------------------------------


def test_unknown_spec_and_bad_arguments_are_one_line_errors(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # main pins them; monkeypatch restores them
    assert peers.main(["--only", "nope", "--no-torch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("peers: unknown spec nope; the specs are act_clamp,")
    assert " attention," in err
    assert peers.main(["--only", "softmax", "-p", "N=x", "--no-torch"]) == 2
    assert "is not an integer" in capsys.readouterr().err
    with pytest.raises(peers.BenchError, match="SPEC:K=V"):
        peers.parse_extra(["attention"])
    assert peers.parse_extra(["matmul:M=2,N=3"]) == [("matmul", {"M": 2, "N": 3})]
    assert cliff.main(["--case", "softmax"]) == 2
    assert "bad case 'softmax'" in capsys.readouterr().err
    assert cliff.main(["--case", "nope:N=3"]) == 2
    assert "unknown spec nope" in capsys.readouterr().err


def test_spec_paths() -> None:
    assert [p.stem for p in harness.spec_paths(["softmax", "bmm", "softmax"])] == ["softmax",
                                                                                  "bmm"]
    assert len(harness.spec_paths()) == len(list((ROOT / "specs").glob("*.ks")))
    with pytest.raises(ValueError, match="unknown spec zz"):
        harness.spec_paths(["zz"])


# -- cliff ---------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.sampled_from(["M", "N", "K", "G", "B", "H", "D"]),
                       st.integers(1, 5000), min_size=1), st.sampled_from([1, 4, 16, 64]))
def test_round_up_is_the_nearest_multiple_above(params: dict[str, int], multiple: int) -> None:
    up = cliff.round_up(params, multiple)
    for k, v in params.items():
        if k in ("G", "B", "H"):
            assert up[k] == v
        else:
            assert up[k] % multiple == 0 and v <= up[k] < v + multiple


def test_cliff_ratio_is_per_unit_of_work() -> None:
    a = cliff.Timed("M=411", 2e-3, 1e6)
    b = cliff.Timed("M=416", 3e-3, 2e6)
    assert cliff.cliff_ratio(a, b) == pytest.approx((2e-3 / 1e6) / (3e-3 / 2e6))
    assert math.isnan(cliff.cliff_ratio(cliff.Timed("x", math.nan, 1.0, "failed"), b))
    text = cliff.markdown([("matmul", a, b)], "python bench/cliff.py", "setup", "p0", "p1")
    assert "| matmul | M=411 | 2 | M=416 | 3 | 1.33x | yes |" in text
    worse = cliff.Timed("M=411", 8e-3, 1e6)
    text = cliff.markdown([("matmul", worse, b)], "c", "s", "", "")
    assert "| 5.33x | **no** (3.56x over) |" in text


def test_cliff_parse_case() -> None:
    assert cliff.parse_case("matmul:M=411,N=149,K=297") == ("matmul",
                                                           {"M": 411, "N": 149, "K": 297})
    for bad in ("matmul", ":M=3", "matmul:", "matmul:M=x"):
        with pytest.raises(cliff.CliffError):
            cliff.parse_case(bad)


# -- torch_peer itself (in .venv-torch, when it is there) -------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not TORCH_PYTHON.exists(), reason="no .venv-torch")
def test_torch_peer_checks_every_side_against_the_given_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    good = e / e.sum(1, keepdims=True)
    results = {}
    for label, ref in (("good", good), ("wrong", good[:, ::-1].copy())):
        data, out = tmp_path / f"{label}.npz", tmp_path / f"{label}.json"
        np.savez(data, __reference__=ref, X=x)
        proc = subprocess.run(
            [str(TORCH_PYTHON), str(ROOT / "bench" / "torch_peer.py"), "--only", "softmax",
             "-p", "M=8", "-p", "N=16", "--data", str(data), "--json", str(out),
             "--threads", "1", "--warmup", "1", "--min-runs", "2", "--min-seconds", "0"],
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results[label] = peers.torch_sides(json.loads(out.read_text()), "softmax")
    assert set(results["good"]) == {"eager", "compile"}
    assert all(s.ok and s.median > 0 for s in results["good"].values())
    assert all(not s.ok and "rel. error" in s.failure for s in results["wrong"].values())
    # inputs that do not match the spec's shapes are refused with exit 2, no traceback
    np.savez(tmp_path / "bad.npz", __reference__=good, X=x[:4])
    proc = subprocess.run(
        [str(TORCH_PYTHON), str(ROOT / "bench" / "torch_peer.py"), "--only", "softmax",
         "-p", "M=8", "-p", "N=16", "--data", str(tmp_path / "bad.npz"), "--json",
         str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "expected arrays" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_torch_environment_is_created_as_torch_peer_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        fails = cmd[0] == "python3"  # say python3 is not 3.11: python3.11 is tried next
        return subprocess.CompletedProcess(cmd, 1 if fails else 0)

    monkeypatch.setattr(peers, "TORCH_ENV", tmp_path / "venv")
    monkeypatch.setattr(peers.subprocess, "run", fake_run)
    assert peers.torch_python() == tmp_path / "venv" / "bin" / "python"
    assert calls[-2] == ["python3.11", "-m", "venv", str(tmp_path / "venv")]
    assert calls[-1] == [str(tmp_path / "venv" / "bin" / "pip"), "install", "torch==2.13.0",
                         "numpy"]
    with pytest.raises(peers.BenchError, match="cannot import torch"):
        peers.torch_python(create=False)

    def no_python(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(peers.subprocess, "run", no_python)
    with pytest.raises(peers.BenchError, match=r"needs Python 3\.11"):
        peers.torch_python()


def test_the_cliff_target_reads_the_worst_case() -> None:
    ok = ("softmax", cliff.Timed("N=1000", 1.0e-3, 1000.0), cliff.Timed("N=1008", 1.0e-3, 1008.0))
    bad = ("matmul", cliff.Timed("M=411", 9e-3, 1e6), cliff.Timed("M=416", 3e-3, 1e6))
    line = {t.what: t for t in peers.targets([], [ok, bad])}["no cliff (2 cases)"]
    assert line.met is False and line.shown == "worst 3.00x (matmul M=411)"
    assert line.value == pytest.approx(1.5 / 3.0)
    assert {t.what: t for t in peers.targets([], [ok])}["no cliff (1 cases)"].met
    assert not any(t.what.startswith("no cliff") for t in peers.targets([]))


def test_blas_overrides_are_unset_and_reported(monkeypatch) -> None:
    """OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are taken out of the environment (with their
    values, for the table's setup line); other variables stay."""
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert peers.free_blas() == {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    assert "OPENBLAS_CORETYPE" not in os.environ
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"
    assert peers.free_blas() == {}


def test_blas_kernel_names_the_kernel_numpys_openblas_runs() -> None:
    """In a fresh process with OPENBLAS_CORETYPE=Haswell, numpy's OpenBLAS reports the
    Haswell kernels (the override works, so unsetting it is what changes the kernel)."""
    code = ("import sys; sys.path.insert(0, 'bench'); import numpy, peers; "
            "print(peers.blas_kernel())")
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                         capture_output=True, check=True).stdout.strip()
    if out == "None":
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    assert out == "Haswell"


def test_rounds_combine_to_the_median_of_their_medians() -> None:
    rounds = [Side(1.0, 0.9, 1.1, True), Side(3.0, 2.0, 4.0, True), Side(2.0, 1.5, 2.5, True)]
    assert Side.combine(rounds) == Side(2.0, 1.5, 2.5, True)
    bad = Side(failure="boom")
    assert Side.combine([*rounds, bad]) == bad and not Side.combine([]).ok
    assert sorted(peers.ALTERNATION) == [0, 0, 0, 1, 1, 1]
