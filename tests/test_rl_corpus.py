"""The training corpus: sizes chosen from the eager program's estimate (or timing) on
the target, the draft sizes without one, never a bundled spec."""

from __future__ import annotations

import math
from pathlib import Path

from kernelsat.hardware.targets import get_target
from kernelsat.learning.corpus import (
    WINDOW,
    eager_seconds,
    generate,
    scale_to_window,
    sizes_of,
    with_sizes,
)
from kernelsat.program import Program
from kernelsat.spec import parse_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"


def test_sized_specs_have_eager_estimates_in_the_window() -> None:
    target = get_target("c")
    drafts = dict(generate(6, seed=1))
    for name, text in generate(6, seed=1, target=target):
        seconds = eager_seconds(parse_spec(text, name), target)
        assert WINDOW[0] <= seconds <= WINDOW[1], (name, seconds)
        # the same draft (ops and shape pattern), only the sizes moved
        assert set(sizes_of(text)) == set(sizes_of(drafts[name]))
        assert text.split("\n", 2)[2] == with_sizes(drafts[name], sizes_of(text)).split("\n", 2)[2]


def test_a_window_the_draft_cannot_reach_is_refused() -> None:
    text = "kernel t(N=64)\nin X[n:N] f32\nout Y[n] = exp(X[n])\n"
    assert scale_to_window(text, "t", get_target("c"), (1e3, 2e3)) is None  # > 64 MB


def test_calibration_moves_the_sizes_until_the_timing_is_in_the_window() -> None:
    # a "machine" 6x slower than the model: the estimate alone would overshoot
    target = get_target("c")
    timed: list[float] = []

    def measure(program: Program) -> float:
        timed.append(6.0 * eager_seconds(program, target))
        return timed[-1]

    for name, text in generate(3, seed=2, target=target, measure=measure):
        seconds = 6.0 * eager_seconds(parse_spec(text, name), target)
        assert WINDOW[0] <= seconds <= WINDOW[1]
        assert "measured" in text.splitlines()[0]
    assert all(math.isfinite(t) for t in timed)


def test_corpus_specs_are_never_bundled_specs() -> None:
    bundled = {p.stem for p in SPECS.glob("*.ks")}
    texts = {p.read_text().split("\n", 1)[-1] for p in SPECS.glob("*.ks")}
    for name, text in generate(8, seed=0, target=get_target("c")):
        assert name not in bundled and text.split("\n", 1)[-1] not in texts


def test_bad_corpus_and_train_options_are_usage_errors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelsat.cli import app

    cases = [
        (["corpus", str(tmp_path / "a"), "--target", "nope"], "--target"),
        (["corpus", str(tmp_path / "b"), "--min-ms", "5", "--max-ms", "1"], "--min-ms"),
        (["corpus", str(tmp_path / "c"), "--target", "none", "--calibrate"], "--calibrate"),
        (["train", "--corpus", str(tmp_path), "--out", str(tmp_path / "p.npz"),
          "--reward", "linear"], "--reward"),
        (["train", "--corpus", str(tmp_path), "--out", str(tmp_path / "p.npz"),
          "--clip", "0"], "--clip"),
    ]
    for args, option in cases:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and option in res.output, (args, res.output)
        assert "Traceback" not in res.output
    assert not any((tmp_path / d).exists() for d in "abc")
