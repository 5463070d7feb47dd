"""The shipped RL checkpoint against the feature layout of today.

`tests/golden/rl_scores.json` was written by the feature code the checkpoint was trained
with (an op one-hot of width `len(Op)`), before the features moved to op properties:
per bundled spec, a saturated e-graph, the policy's score of every node row and its
greedy rollout. Read for the current layout (`upgrade_policy`), the checkpoint must score
those same e-graphs identically and take the same decisions, and it must also run on a
spec with an op it never saw (`softplus`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelsat.egraph.snapshot import ENode, Snapshot
from kernelsat.extract.rl import DEFAULT_CHECKPOINT, load_policy
from kernelsat.extract.rl_env import (
    LEGACY_N_FEATURES,
    LEGACY_OPS,
    N_FEATURES,
    N_PROGRAM,
    N_SCHED,
    ExtractionEnv,
    Featurizer,
    node_table,
    upgrade_policy,
)
from kernelsat.extract.rl_policy import Policy, rollout
from kernelsat.hardware.targets import get_target
from kernelsat.ops import Op

GOLDEN = Path(__file__).parent / "golden" / "rl_scores.json"

pytestmark = pytest.mark.skipif(not DEFAULT_CHECKPOINT.exists(), reason="no shipped checkpoint")


def _attr(a: Any) -> Any:
    return tuple(a) if isinstance(a, list) else a


def _snapshot(data: dict[str, Any]) -> Snapshot:
    nodes = [ENode(Op(op), tuple(_attr(a) for a in attrs), tuple(kids))
             for op, attrs, kids in data["nodes"]]
    return Snapshot(nodes, np.array(data["node_class"]), data["classes"],
                    [dict(s) for s in data["class_shape"]], data["root"])


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def _rows(feat: Featurizer) -> np.ndarray:
    extra = np.zeros(3 + len(feat.target) + 1 + N_SCHED)  # phase 0, no schedule columns
    extra[3:3 + len(feat.target)] = feat.target
    return np.hstack([feat.table, np.broadcast_to(extra, (len(feat.table), len(extra)))])


def test_the_shipped_file_is_the_first_layout_and_loads_widened() -> None:
    raw, _ = Policy.load(DEFAULT_CHECKPOINT)
    assert raw.n_features == LEGACY_N_FEATURES  # the file itself is unchanged
    policy = load_policy()
    assert policy.n_features == N_FEATURES > LEGACY_N_FEATURES
    assert policy.meta["upgraded_from"] == LEGACY_N_FEATURES


@pytest.mark.parametrize("name", sorted(_golden()["specs"]))
def test_scores_and_greedy_decisions_are_unchanged(name: str) -> None:
    golden = _golden()
    case = golden["specs"][name]
    snap = _snapshot(case["snapshot"])
    feat = Featurizer.of(snap, snap.root, get_target(golden["target"]))
    z, _ = load_policy().scores(_rows(feat))
    np.testing.assert_allclose(z, case["node_scores"], rtol=1e-9, atol=1e-12)
    env = ExtractionEnv(snap, snap.root, featurize=feat)
    decisions, _, info = rollout(env, load_policy(), None)
    assert [d.action for d in decisions] == case["greedy_actions"]
    assert str(info["term"]) == case["greedy_term"]


def test_the_width_does_not_depend_on_the_number_of_ops() -> None:
    # an op outside the frozen legacy block (softplus) is seen only through its properties
    assert Op.SOFTPLUS.value not in LEGACY_OPS
    assert set(LEGACY_OPS) <= {op.value for op in Op}
    snap = Snapshot([ENode(Op.IN, ("x",), ()), ENode(Op.SOFTPLUS, (), (0,)),
                     ENode(Op.EXP, (), (0,))],
                    np.array([0, 1, 2]), [[0], [1], [2]], [{}, {}, {}], 1)
    rows = node_table(snap, 1, [1.0, 1.0, 1.0])
    legacy = slice(0, len(LEGACY_OPS))
    assert not rows[1, legacy].any() and rows[2, legacy].sum() == 1.0
    assert rows.shape[1] == N_PROGRAM - 3 - 9
    assert rows[1, -13:].any()  # its properties (unary, transcendental, positive ...)


def test_the_widened_policy_runs_on_a_softplus_spec() -> None:
    from kernelsat.egraph.saturate import saturate
    from kernelsat.extract.base import ASTSize
    from kernelsat.extract.rl import RLExtractor
    from kernelsat.rewrites.library import library_rules
    from kernelsat.spec import parse_spec

    prog = parse_spec("kernel sp(N=64)\nin X[i:N] f32\nout Y[i] = softplus(X[i]) * 2\n")
    snap = saturate(prog.term, library_rules(), iters=3, nodes=300, seconds=20.0).snapshot
    assert any(n.op is Op.SOFTPLUS for n in snap.nodes)
    found = RLExtractor(n=3, target="h100").extract(snap, snap.root, ASTSize())
    assert found and found[0].status == "policy-greedy"


def test_upgrade_keeps_scores_and_widens_the_adam_state() -> None:
    rng = np.random.default_rng(3)
    old = Policy.init(LEGACY_N_FEATURES, 5, seed=2)
    old.params["u"] = rng.normal(size=2 * LEGACY_N_FEATURES)
    extra = {"adam_m_W1": rng.normal(size=(LEGACY_N_FEATURES, 5)),
             "adam_v_u": rng.normal(size=2 * LEGACY_N_FEATURES), "adam_t": np.array([4])}
    new = upgrade_policy(old, extra)
    assert new.n_features == N_FEATURES and extra["adam_m_W1"].shape == (N_FEATURES, 5)
    assert extra["adam_v_u"].shape == (2 * N_FEATURES,)
    x_old = rng.normal(size=(7, LEGACY_N_FEATURES))
    at = LEGACY_N_FEATURES - 12  # the property columns sit before the dynamic and target ones
    x_new = np.hstack([x_old[:, :at], rng.normal(size=(7, N_PROGRAM - LEGACY_N_FEATURES)),
                       x_old[:, at:], rng.normal(size=(7, N_FEATURES - N_PROGRAM))])
    np.testing.assert_allclose(new.scores(x_new)[0], old.scores(x_old)[0])
    mask = np.ones(7, bool)
    assert new.value(x_new, mask) == pytest.approx(old.value(x_old, mask))
    assert upgrade_policy(new) is new
    with pytest.raises(ValueError, match="input features"):
        upgrade_policy(Policy.init(LEGACY_N_FEATURES + 1, 3))


def test_a_program_layout_policy_scores_program_rows_as_before() -> None:
    # a policy trained before the joint layout (N_PROGRAM inputs): the phase and
    # schedule columns are appended with zero weights, whatever they hold
    rng = np.random.default_rng(5)
    old = Policy.init(N_PROGRAM, 6, seed=4)
    old.params["u"] = rng.normal(size=2 * N_PROGRAM)
    extra = {"adam_m_W1": rng.normal(size=(N_PROGRAM, 6)),
             "adam_v_u": rng.normal(size=2 * N_PROGRAM)}
    new = upgrade_policy(old, extra)
    assert new.n_features == N_FEATURES and new.meta["upgraded_from"] == N_PROGRAM
    assert extra["adam_m_W1"].shape == (N_FEATURES, 6)
    assert extra["adam_v_u"].shape == (2 * N_FEATURES,)
    np.testing.assert_array_equal(extra["adam_m_W1"][N_PROGRAM:], 0.0)
    x_old = rng.normal(size=(5, N_PROGRAM))
    x_new = np.hstack([x_old, rng.normal(size=(5, N_FEATURES - N_PROGRAM))])
    np.testing.assert_allclose(new.scores(x_new)[0], old.scores(x_old)[0])
    mask = np.ones(5, bool)
    assert new.value(x_new, mask) == pytest.approx(old.value(x_old, mask))
