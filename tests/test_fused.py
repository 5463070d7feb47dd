"""The e-graph reaches the fused forms the design promises, and they prove and run.

On attention, the root class holds one fused kernel using `SoftmaxAvg` over the split
key axis (`SoftmaxAvg_no(LSE_ni(...), SoftmaxAvg_ni(...))`), found by general rules only;
on softmax, layernorm and rmsnorm a single-kernel program. Each is extracted with a
cost that prefers the online reductions, explained from the firing log, and accepted
by the independent checker. Every spec saturates within its default limits and says
why it stopped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelsat.driver.pipeline import Options, prove_term, saturate_program
from kernelsat.extract import extract
from kernelsat.extract.base import OpCost
from kernelsat.extract.online import ONLINE_COST, online_preference
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import postorder
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec
from kernelsat.testing import relative_error

SPECS = sorted(Path(__file__).resolve().parents[1].glob("specs/*.ks"))

# The costs of optimize's `online` extractor: FUSED is its table, TILED the whole cost
# (an online reduction over an unsplit axis also costs more than its tiled form).
FUSED = OpCost(ONLINE_COST, default=2.0)
TILED = online_preference


@pytest.fixture(scope="module")
def library():
    return load_library()


def _saturate(program, library):
    return saturate_program(program, library)


def _check_numerics(program, term) -> None:
    env = random_inputs(program, seed=5)
    want = evaluate_as(program.term, env, program.out_axes)
    got = evaluate_as(term, env, program.out_axes)
    assert relative_error(got, want) < 1e-9


def test_attention_reaches_one_fused_kernel_with_softmaxavg_over_a_split_key_axis(library):
    program = load_spec("specs/attention.ks", {"N": 256})
    sat = _saturate(program, library)
    best = extract(sat.snapshot, "greedy-tree", cost=TILED)[0].term
    assert best.op is Op.SOFTMAXAVG and best.axis == "n/o64", best
    assert best.args[0].op is Op.LSE and best.args[0].axis == "n/i64"
    assert best.args[1].op is Op.SOFTMAXAVG and best.args[1].axis == "n/i64"
    assert not any(n.op is Op.STORE for n in postorder(best))
    _, steps, status = prove_term(program, sat.snapshot, library, best)
    assert status == "accepted" and steps > 0
    _check_numerics(program, best)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "logsumexp"])
def test_normalizations_reach_a_single_kernel_with_an_online_reduction(library, name):
    program = load_spec(f"specs/{name}.ks", {"M": 64, "N": 256} if name != "rmsnorm" else None)
    sat = _saturate(program, library)
    best = extract(sat.snapshot, "greedy-tree", cost=FUSED)[0].term
    assert not any(n.op is Op.STORE for n in postorder(best))
    _, _, status = prove_term(program, sat.snapshot, library, best)
    assert status in ("accepted", "eager"), status
    _check_numerics(program, best)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_saturates_within_its_default_limits(library, path):
    program = load_spec(str(path))
    sat = _saturate(program, library)
    assert sat.stop_reason in ("saturated", "iteration limit", "node limit", "time limit")
    assert sat.seconds < 3 * Options().sat_seconds
    assert sat.snapshot.n_nodes > 0 and 0 <= sat.snapshot.root < sat.snapshot.n_classes


def test_fused_softmax_runs_in_c_and_matches_float64(library):
    from kernelsat.codegen import run_program

    program = load_spec("specs/softmax.ks", {"M": 64, "N": 256})
    sat = _saturate(program, library)
    best = extract(sat.snapshot, "greedy-tree", cost=FUSED)[0].term
    env = random_inputs(program, seed=2)
    got = run_program(best, program.out_axes, {k: v.astype(np.float32) for k, v in env.items()},
                      "c")
    want = evaluate_as(program.term, env, program.out_axes)
    assert relative_error(got, want) < 1e-5
