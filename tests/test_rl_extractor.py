"""RLExtractor (the Extractor protocol), the reward oracle, the corpus and the commands."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings

from kernelsat.extract.base import ASTSize, check_extraction
from kernelsat.extract.rl import RLExtractor
from kernelsat.extract.rl_env import N_FEATURES
from kernelsat.extract.rl_policy import Policy


def _load_env_tests():  # pytest runs with --import-mode=importlib: load the sibling by path
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_rl_env",
                                                  Path(__file__).with_name("test_rl_env.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snapshots = _load_env_tests().snapshots


@settings(max_examples=40, deadline=None)
@given(snapshots())
def test_extractions_are_distinct_acyclic_and_class_correct(snap) -> None:
    from kernelsat.extract.base import ExtractionError

    ex = RLExtractor(n=5, policy=Policy.init(N_FEATURES, 8, seed=1), target="h100")
    try:
        out = ex.extract(snap, 0, ASTSize())
    except ExtractionError:
        return
    assert 1 <= len(out) <= 5
    assert len({e.term.key for e in out}) == len(out)
    for e in out:
        assert set(check_extraction(snap, 0, e.choice)) == set(e.choice)
        assert e.method == "rl"
    assert out[0].status == "policy-greedy"


def test_shipped_checkpoint_loads() -> None:
    from kernelsat.extract.rl import DEFAULT_CHECKPOINT, load_policy

    if not DEFAULT_CHECKPOINT.exists():
        pytest.skip("no shipped checkpoint in this checkout")
    policy = load_policy()
    assert policy.n_features == N_FEATURES
    assert policy.meta["episodes"] > 0


def test_corpus_is_deterministic_and_parses(tmp_path: Path) -> None:
    from kernelsat.learning.corpus import generate, write_corpus
    from kernelsat.spec import load_spec

    assert generate(6, seed=3) == generate(6, seed=3)
    paths = write_corpus(tmp_path, 6, seed=3)
    assert all(load_spec(p).term is not None for p in paths)
    specs = {p.stem for p in Path(__file__).parent.parent.glob("specs/*.ks")}
    assert not specs & {p.stem for p in paths}  # the benchmark specs stay held out


@dataclass
class CountingBackend:
    """Fake timings: a program's time is its number of distinct nodes (no clock)."""

    jobs: list[str] = field(default_factory=list)
    retimed: list[str] = field(default_factory=list)  # jobs re-timing a measured program
    name: str = "fake"

    def run(self, jobs, progress=None):
        from kernelsat.driver.jobs import JobResult
        from kernelsat.ir import postorder
        from kernelsat.sexpr import parse_term

        for j in jobs:
            (self.retimed if j.retime else self.jobs).append(j.program)
        return [JobResult(j.key, True, float(len(list(postorder(parse_term(j.program))))),
                          knobs={}) for j in jobs]

    def close(self) -> None:
        pass


def test_oracle_proof_gates_memoizes_and_logs_reasons() -> None:
    from dataclasses import replace

    from kernelsat.extract.rl import proposal_key
    from kernelsat.ir import Const, add
    from kernelsat.learning.rl_train import PENALTY, TRAIN_OPTIONS, Oracle, make_task
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import parse_spec

    library = load_library()
    program = parse_spec("kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n", "k")
    task = make_task("k", program, library, replace(TRAIN_OPTIONS, iters=3, nodes=300))
    backend = CountingBackend()
    oracle = Oracle([task], library, backend, TRAIN_OPTIONS)
    unproved = add(program.term, Const(0.0))  # equal, but not in the e-graph: no chain
    rewards = oracle([(0, program.term), (0, unproved), (0, program.term)])
    assert rewards[0] == 0.0 and rewards[2] == 0.0  # the eager spec: log(t/t)
    assert rewards[1] == PENALTY
    assert task.outcomes[proposal_key(unproved, None)].reason.startswith("proof:")
    assert len(backend.jobs) == 1  # eager timed once, the unproved program never
    oracle([(0, program.term)])
    assert len(backend.jobs) == 1
    assert math.isclose(task.best_speedup, 1.0)


def test_oracle_does_not_time_a_program_the_cost_model_puts_far_past_eager() -> None:
    """As optimize and the evaluation: a proved program whose roofline estimate is beyond
    PRUNE_FACTOR x the eager program's gets the worst reward, with the reason, and is never
    sent to the backend (a recomputing program can run for minutes); one within it is."""
    from dataclasses import replace

    from kernelsat.driver.pipeline import PRUNE_FACTOR
    from kernelsat.extract.rl import proposal_key
    from kernelsat.learning.rl_train import PENALTY, TRAIN_OPTIONS, Oracle, make_task
    from kernelsat.proofs.library import load_library
    from kernelsat.sexpr import parse_term
    from kernelsat.spec import parse_spec

    head = "kernel k(N=1024, M=65536)\nin x[n:N] f32\nin w[m:M] f32\n"
    program = parse_spec(head + "out y[n] = exp(x[n]) * sum(m: w[m])\n", "k")
    slow = parse_spec(head + "out y[n] = sum(m: exp(x[n] * w[m]))\n", "k").term
    near = parse_spec(head + "out y[n] = exp(x[n]) * sum(m: w[m]) + 1\n", "k").term
    library = load_library()
    task = make_task("k", program, library, replace(TRAIN_OPTIONS, iters=1, nodes=100))
    backend = CountingBackend()
    oracle = Oracle([task], library, backend, TRAIN_OPTIONS)
    assert oracle.estimate(0, slow) > PRUNE_FACTOR * oracle.estimate(0, program.term)
    rewards = oracle([(0, slow), (0, near)], proofs=["accepted", "accepted"])
    assert rewards[0] == PENALTY and oracle.screened == 1
    assert task.outcomes[proposal_key(slow, None)].reason.startswith("screened: estimate")
    sent = {parse_term(p).key for p in backend.jobs}
    assert slow.key not in sent and near.key in sent  # within the limit: timed
