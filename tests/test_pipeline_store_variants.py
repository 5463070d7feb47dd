"""Materialization variants: `optimize`'s extraction adds, for each extracted program,
variants that store the classes the spec itself materialized. The spec's Store operands
are found in the saturated e-graph structurally, so the variants exist; for swiglu one of
them is the 2-kernel program H = silu(X Wg) * (X Wu) (one multi-contraction kernel) and
Y = H Wd."""

from __future__ import annotations

from kernelsat.driver.pipeline import (
    Options,
    _extract,
    _store_classes,
    as_program,
    kernel_count,
    saturate_program,
)
from kernelsat.extract.base import RooflineCost
from kernelsat.hardware.targets import get_target
from kernelsat.ir import postorder
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library


def _quiet(stage: str, message: str) -> None:
    pass


def test_the_spec_store_operands_are_found_and_swiglu_gets_its_two_kernel_variant() -> None:
    program = as_program("specs/swiglu.ks", {"T": 32, "D": 32, "F": 64})
    opts = Options()
    sat = saturate_program(program, load_library(), opts)
    snap = sat.snapshot
    stores = _store_classes(program.term, snap)
    spec_stores = [n for n in postorder(program.term) if n.op is Op.STORE]
    assert len(stores) == len(spec_stores) == 3
    assert all(snap.storable(c) for c in stores)
    hw = get_target("c")
    cands = _extract(program, sat, opts, RooflineCost.for_target(hw), _quiet, hw)
    counts = {kernel_count(c.term) for c in cands}
    assert 2 in counts, counts
    assert any("+store" in m for c in cands for m in c.methods)


def test_a_term_outside_the_egraph_has_no_class() -> None:
    program = as_program("specs/rowsum.ks", {"M": 4, "N": 8})
    other = as_program("specs/softmax.ks", {"M": 4, "N": 8})
    snap = saturate_program(program, load_library(), Options()).snapshot
    assert snap.classes_of(program.term)[program.term] == snap.root
    assert other.term not in snap.classes_of(other.term)
