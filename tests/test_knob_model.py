"""The schedule cost model and the model-ranked knob search.

Features on hand-built loop nests (footprints, stride-1 detection, chains, tails,
register tiles, load balance), rankings of clearly bad settings below good ones on real
lowered kernels, the ranked search against fake measurements, and features kept in the
measurement cache (old cache files migrate)."""

from __future__ import annotations

import itertools
import math
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen.loops import (
    Affine,
    Array,
    Assign,
    Call,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
)
from kernelsat.codegen.lower import LoweredProgram, lower
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.knobs import (
    codegen_knobs,
    knob_table,
    plan,
    rank_settings,
    search,
    space_size,
    tune,
)
from kernelsat.hardware.measure import Measurement, random_inputs
from kernelsat.hardware.schedule_model import (
    KernelFeatures,
    ScheduleModel,
    nest_features,
    predict,
)
from kernelsat.hardware.targets import Target, get_target
from kernelsat.ir import In, Sum, exp

KIB = 1024

# fixed figures (not this machine's): AVX-512-like, 2 cores, 48 KiB L1, 2 MiB L2
T: Target = replace(get_target("cpu"), simd_bits=512, registers_per_unit=512, units=2,
                    shared_mem_per_unit=48 * KIB, l2_bytes=2 * KIB * KIB,
                    llc_bytes=32 * KIB * KIB, frequency_hz=2.6e9, peak_fp32=332.8e9,
                    mem_bandwidth=20e9, launch_overhead=3e-6, transcendental_penalty=12.0)

i, j, k, lane = (Affine.var(v) for v in ("i", "j", "k", "l"))


def copy_nest(n: int, stride: int = 1) -> tuple[Loop, ...]:
    return (Loop("i", n, (Write("out", i, Load("x", i.scale(stride))),), "parallel"),)


# -- features of hand-built nests ---------------------------------------------------------


def test_footprint_of_a_stream() -> None:
    f = nest_features(copy_nest(1024), {}, T)
    assert f.footprints == (8 * KIB,)  # 4 KiB read + 4 KiB written
    assert f.l1_fill_bytes == 8 * KIB  # fits: every line once
    assert f.vector_fraction == 1.0 and f.strided_accesses == 0


def test_strided_inner_loop_gathers_and_wastes_lines() -> None:
    unit, strided = nest_features(copy_nest(1 << 16), {}, T), nest_features(
        copy_nest(1 << 16, stride=64), {}, T)
    assert strided.strided_accesses == 1 << 16 and unit.strided_accesses == 0
    # a strided read is a gather: one load per element instead of one per vector
    assert strided.register_bytes > 8 * unit.register_bytes
    # a 64-float stride brings a whole line per element: 16x the bytes of the stream
    assert strided.dram_bytes > 8 * unit.dram_bytes
    assert predict(strided, T) > 2 * predict(unit, T)


def test_strided_write_is_not_vectorised() -> None:
    body = (Write("out", i.scale(64), Load("x", i)),)
    f = nest_features((Loop("i", 4096, body, "parallel"),), {}, T)
    assert f.vector_fraction == 0.0 and f.strided_accesses == 4096


def test_few_vector_accumulators_wait_on_the_fma_latency() -> None:
    def tile(vectors: int) -> tuple[Stmt, ...]:
        at = Ref("acc", Affine.var("v").scale(16) + lane)
        upd = Assign(at, Call("add", (at, Load("x", k.scale(16 * vectors)
                                                + Affine.var("v").scale(16) + lane))))
        return (Array("acc", 16 * vectors, 0.0), Loop("k", 1024, (Loop("v", vectors, (
            Loop("l", 16, (upd,), "vector"),), "vector"),), "reduce"))

    one, eight = nest_features(tile(1), {}, T), nest_features(tile(8), {}, T)
    assert one.latency_cycles == 1024 * 4 and eight.latency_cycles == 0


def test_loop_order_decides_stride_one() -> None:
    body = (Write("out", i.scale(512) + j, Call("exp", (Load("x", i.scale(512) + j),))),)
    rows = (Loop("i", 256, (Loop("j", 512, body, "parallel"),), "parallel"),)
    cols = (Loop("j", 512, (Loop("i", 256, body, "parallel"),), "parallel"),)
    fr, fc = nest_features(rows, {}, T), nest_features(cols, {}, T)
    assert fr.vector_fraction == 1.0 and fc.vector_fraction == 0.0
    assert fr.flops == fc.flops and fr.transcendentals == fc.transcendentals == 256 * 512
    assert predict(fr, T) < predict(fc, T)


def test_scalar_reduction_is_a_chain_and_lanes_vectorise() -> None:
    chain = (Let("acc", Lit(0.0), mutable=True),
             Loop("k", 4096, (Assign(Ref("acc"), Call("add", (Ref("acc"), Load("x", k)))),),
                  "reduce"),
             Write("out", Affine(), Ref("acc")))
    f = nest_features(chain, {}, T)
    assert f.chain_ops == 4096 and f.vector_flops == 0
    acc = Ref("acc", lane)
    lanes = (Array("acc", 16, 0.0),
             Loop("k", 256, (Loop("l", 16, (Assign(acc, Call("add", (acc, Load(
                 "x", k.scale(16) + lane)))),), "vector"),), "reduce"),
             Write("out", Affine(), Ref("acc", Affine())))
    g = nest_features(lanes, {}, T)
    # 4096 adds, each statement one op more (STATEMENT_OPS)
    assert g.chain_ops == 0 and g.vector_flops == 2 * 4096 and g.lane_use == 1.0
    assert predict(g, T) < predict(f, T)


@given(st.integers(1, 100))
@settings(max_examples=30, deadline=None)
def test_tail_lane_use(n: int) -> None:
    f = nest_features(copy_nest(n), {}, T)
    if n > 1:
        assert math.isclose(f.lane_use, n / (math.ceil(n / 16) * 16))
    else:
        assert f.vector_flops == 0


def _register_tile(rows: int, cols: int) -> tuple[Loop, ...]:
    """out[i, j] = sum_k a[i, k] * b[k, j] with a rows x cols accumulator tile per
    (i0, j0) block: the register tile of a matmul."""
    m = n = 256
    kk = 256
    i0, j0 = Affine.var("i0"), Affine.var("j0")
    ii, jj = Affine.var("ii"), Affine.var("jj")
    row, col = i0.scale(rows) + ii, j0.scale(cols) + jj
    at = Ref("acc", ii.scale(cols) + jj)
    update = Assign(at, Call("add", (at, Call("mul", (Load("a", row.scale(kk) + k),
                                                       Load("b", k.scale(n) + col))))))
    tile = Loop("k", kk, (Loop("ii", rows, (Loop("jj", cols, (update,), "vector"),),
                                "vector"),), "reduce")
    store = Loop("ii", rows, (Loop("jj", cols, (Write("out", row.scale(n) + col, at),),
                                   "tile"),), "tile")
    return (Loop("i0", m // rows, (Loop("j0", n // cols, (
        Array("acc", rows * cols, 0.0), tile, store), "parallel"),), "parallel"),)


def test_register_tile_that_spills() -> None:
    good, spill = nest_features(_register_tile(8, 32), {}, T), nest_features(
        _register_tile(32, 64), {}, T)
    assert good.register_floats == 256 and not good.spills
    assert spill.register_floats == 2048 and spill.spills
    # the spilled tile loads and stores its accumulators every k step
    assert spill.register_bytes > 2 * good.register_bytes
    assert predict(spill, T) > predict(good, T)


def test_small_tile_pays_more_loads_than_a_register_tile() -> None:
    small, good = nest_features(_register_tile(1, 16), {}, T), nest_features(
        _register_tile(8, 32), {}, T)
    assert small.register_bytes > 2 * good.register_bytes
    assert predict(small, T) > predict(good, T)


def test_parallel_extent_and_balance() -> None:
    f = nest_features(copy_nest(3), {}, T)
    assert (f.parallel_extent, f.threads, f.balance) == (3, 2, 0.75)
    g = nest_features(copy_nest(3), {"omp": False}, T)
    assert (g.threads, g.balance, g.regions) == (1, 1.0, 0.0)


def test_features_round_trip_as_dict() -> None:
    f = nest_features(_register_tile(8, 32), {}, T)
    assert KernelFeatures.from_dict(f.as_dict()) == f


# -- rankings on real lowered kernels --------------------------------------------------------


def _matmul(n: int = 128) -> LoweredProgram:
    a = In("A", (("i", n), ("k", n)))
    b = In("B", (("k", n), ("j", n)))
    from kernelsat.ir import Dot

    return lower(Dot("k", a, b), ("i", "j"))


def test_ranking_puts_spilling_and_strided_settings_below_the_register_tile() -> None:
    low = _matmul()
    model = ScheduleModel(low, T)
    loops = {"gemm": False, "order": ("i", "j")}  # the generic loop-nest lowering
    good = model.kernel_seconds(0, {**loops, "tile.i": 8, "tile.j": 32})
    spill = model.kernel_seconds(0, {**loops, "tile.i": 64, "tile.j": 64})
    strided = model.kernel_seconds(0, {**loops, "order": ("j", "i"), "tile.i": 1, "tile.j": 1})
    assert model.features(0, {**loops, "tile.i": 64, "tile.j": 64}).spills
    assert not model.features(0, {**loops, "tile.i": 8, "tile.j": 32}).spills
    assert good < spill and good < strided


def test_ranking_of_blocked_gemm_tiles() -> None:
    low = _matmul(256)
    model = ScheduleModel(low, T)
    base = {"gemm": True, "mr": 6, "nr": 64, "vw": 16}
    full = model.kernel_seconds(0, base)
    narrow = model.kernel_seconds(0, {**base, "vw": 4})  # a quarter of each vector used
    thin = model.kernel_seconds(0, {**base, "mr": 1, "nr": 16})  # latency- and load-bound
    serial = model.kernel_seconds(0, {**base, "par": "none"})
    assert full < narrow and full < thin and full < serial
    f = model.features(0, base)
    assert f.flops == 2 * 256**3 and f.native_cycles > 0 and not f.native_spills


def test_row_loop_order_beats_column_order_for_a_row_reduction() -> None:
    x = In("x", (("i", 512), ("n", 256)))
    low = lower(Sum("n", exp(x)), ("i",))
    model = ScheduleModel(low, T)
    lanes = model.kernel_seconds(0, {"vec": 16})
    scalar = model.kernel_seconds(0, {"vec": 1})
    assert model.features(0, {"vec": 1}).chain_ops > 0
    assert lanes < scalar


# -- the ranking and the search ---------------------------------------------------------------

small_tables = st.dictionaries(
    st.sampled_from(["k0", "k1", "k2"]),
    st.dictionaries(st.sampled_from(["a", "b", "c"]),
                    st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True).map(tuple),
                    min_size=1, max_size=2),
    min_size=1, max_size=3)


@given(small_tables, st.integers(1, 12), st.integers(0, 5))
@settings(max_examples=40, deadline=None)
def test_rank_settings_is_the_k_best_sums(table, limit: int, salt: int) -> None:
    def cost(kernel: str, knobs) -> float:
        return float(sum((v * (3 + salt) + hash(kernel) % 7) % 11 for v in knobs.values()))

    got = rank_settings(table, cost, limit=limit)
    names = [(kn, n) for kn, knobs in table.items() for n in knobs]
    every = sorted(sum(cost(kn, {n: v}) for (kn, n), v in zip(names, vals, strict=True))
                   for vals in itertools.product(*(table[kn][n] for kn, n in names)))
    want = every[:limit]
    assert [p for p, _ in got] == want
    for p, s in got:  # each ranked setting is legal and priced right
        assert set(s) == set(table)
        assert math.isclose(p, sum(cost(kn, s[kn]) for kn in s))


TABLE: dict[str, dict[str, tuple[int, ...]]] = {
    "k0": {"tile": (1, 2, 4, 8, 16, 32, 64), "unroll": (1, 2, 4)}, "k1": {"vec": (4, 8, 16)}}


def true_cost(setting) -> float:
    t, u, v = setting["k0"]["tile"], setting["k0"]["unroll"], setting["k1"]["vec"]
    return 1.0 + abs(np.log2(t) - 4) + abs(u - 2) + abs(v - 8) / 4


def fake(setting) -> Measurement:
    c = true_cost(setting)
    return Measurement(c, c, c, 1, 0.0, True)


def test_ranked_search_finds_the_optimum_within_a_small_budget() -> None:
    # a model that ranks right but prices wrong (a monotone distortion plus noise
    # smaller than the gaps)
    def model(kernel: str, knobs) -> float:
        part = ({"k0": knobs, "k1": {"tile": 16, "unroll": 2, **{"vec": 8}}}
                if kernel == "k0" else {"k0": {"tile": 16, "unroll": 2}, "k1": knobs})
        return math.exp(true_cost(part)) + 0.01 * (hash(str(knobs)) % 3)

    ranked = [s for _, s in rank_settings(TABLE, model, limit=3)]
    calls: list = []

    def evaluate(s):
        calls.append(s)
        return fake(s)

    r = search(TABLE, evaluate, budget=3, ranked=ranked)
    assert r.best == {"k0": {"tile": 16, "unroll": 2}, "k1": {"vec": 8}}
    assert len(calls) <= 3


def test_wrong_model_is_corrected_by_moves_with_a_larger_budget() -> None:
    def wrong(setting) -> float:  # prefers tile 4, the truth tile 16
        return abs(np.log2(setting["k0"]["tile"]) - 2) + abs(setting["k0"]["unroll"] - 2)

    ranked = sorted(
        ({"k0": {"tile": t, "unroll": u}, "k1": {"vec": v}} for t in TABLE["k0"]["tile"]
         for u in TABLE["k0"]["unroll"] for v in TABLE["k1"]["vec"]), key=wrong)
    small = search(TABLE, fake, budget=3, ranked=ranked[:3], predict=wrong)
    big = search(TABLE, fake, budget=30, ranked=ranked[:30], predict=lambda s: 1.0)
    assert true_cost(big.best) == 1.0 and true_cost(big.best) <= true_cost(small.best)


@given(st.integers(1, 30), st.integers(0, 100))
@settings(max_examples=20, deadline=None)
def test_ranked_search_stays_legal_and_within_budget(budget: int, seed: int) -> None:
    ranked = [s for _, s in rank_settings(
        TABLE, lambda k, s: float(sum(s.values())), limit=budget, seed=seed)]
    calls: list = []

    def evaluate(s):
        calls.append(s)
        return fake(s)

    r = search(TABLE, evaluate, budget=budget, ranked=ranked,
               predict=lambda s: float(sum(v for knobs in s.values() for v in knobs.values())))
    assert len(calls) <= budget and r.best_measurement is not None
    assert r.best_measurement.median == min(t.measurement.median for t in r.trials)
    assert len({str(t.setting) for t in r.trials}) == len(r.trials) <= space_size(TABLE)


def test_vector_widths_wider_than_the_target_are_dropped() -> None:
    class K:
        name = "k0"

        def knob_space(self):
            return {"vw": (16, 8, 4), "tile": (1, 2)}

    class P:
        kernels = (K(),)

    assert knob_table(P(), "c", T)["k0"]["vw"] == (16, 8, 4)
    assert knob_table(P(), "c", replace(T, simd_bits=256))["k0"]["vw"] == (8, 4)
    # narrowed to one value that is not codegen's default: still passed to codegen
    assert knob_table(P(), "c", replace(T, simd_bits=128))["k0"]["vw"] == (4,)
    assert knob_table(P(), "c")["k0"]["vw"] == (16, 8, 4)  # no target: unchanged


# -- the cache keeps features -----------------------------------------------------------------


def test_tune_keeps_features_in_the_cache(tmp_path: Path, monkeypatch) -> None:
    # fake timings: a private timing lock, not the machine's (others may be timing)
    import importlib

    from kernelsat.hardware.timing_lock import TimingLock, timing_session

    measure_mod = importlib.import_module("kernelsat.hardware.measure")

    lock = TimingLock(tmp_path / "t.lock")
    monkeypatch.setattr(measure_mod, "timing_session",
                        lambda: timing_session(lock=lock, probe=lambda: math.nan))
    low = _matmul(32)
    found = plan(low, T, budget=4)
    assert found.ranked and found.predict is not None
    inputs = random_inputs({"A": (32, 32), "B": (32, 32)})
    ref = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    costs: dict[str, float] = {}

    def fake_build(lowered, backend, per_kernel):
        def exe(ins, out):
            np.matmul(ins["A"], ins["B"], out=out)
        costs["last"] = found.predict({"k0": {n: per_kernel[0][n] for n in found.table["k0"]}})
        return exe

    def timer(thunk):
        thunk()
        return costs["last"]

    kwargs = {"min_runs": 2, "min_seconds": 0.0, "warmup": 0, "flush_cache": False,
              "timer": timer}
    with MeasureCache(tmp_path / "m.sqlite") as db:
        r = tune(low, T, inputs, (32, 32), ref, program_key="p", budget=4, cache=db,
                 build=fake_build, measure_kwargs=kwargs)
        assert r.measured == len(r.trials) <= 4
        # measured in the model's order, and the model's best wins a model-priced race
        assert r.best == found.ranked[0]
        rows = db.samples(T.fingerprint, "p")
        assert len(rows) == r.measured
        for s in rows:
            setting = s.knobs
            kernel = s.features["kernels"][0]
            back = KernelFeatures.from_dict(kernel)
            assert back == found.model.features(0, codegen_knobs(low, setting)[0])
            assert math.isclose(s.features["predicted"], found.predict(setting))
            assert math.isclose(s.median, found.predict(setting))


OLD_SCHEMA = """
CREATE TABLE measurements (
    target TEXT NOT NULL, program TEXT NOT NULL, knobs TEXT NOT NULL, dtype TEXT NOT NULL,
    median REAL, q1 REAL, q3 REAL, runs INTEGER NOT NULL, rel_err REAL, ok INTEGER NOT NULL,
    failure TEXT NOT NULL, timestamp REAL NOT NULL,
    PRIMARY KEY (target, program, knobs, dtype));
"""


def test_old_cache_file_migrates_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO measurements VALUES ('fp','p','{\"t\":1}','float32',"
                     "0.5,0.4,0.6,10,1e-7,1,'',0.0)")
    with MeasureCache(path) as db:
        assert db.get("fp", "p", {"t": 1}, "float32").median == 0.5
        assert db.samples() == []  # no features before the migration
        db.put("fp", "p", {"t": 2}, "float32", Measurement(0.25, 0.2, 0.3, 5, 0.0, True),
               features={"kernels": [{"flops": 1.0}], "predicted": 0.1})
        db.put("fp", "p", {"t": 3}, "float32", Measurement.failed("too slow"),
               features={"kernels": [], "predicted": 9.0})
        got = db.samples("fp")
        assert [(s.knobs, s.ok) for s in got] == [({"t": 2}, True), ({"t": 3}, False)]
        assert got[0].median == 0.25 and got[0].features["predicted"] == 0.1
        assert math.isnan(got[1].median)
    with sqlite3.connect(path) as conn:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(measurements)")}
    assert {"probe", "features"} <= cols


def test_moves_predicted_far_slower_are_not_measured() -> None:
    def predict(s) -> float:  # unroll 4 predicted catastrophic (a recomputing loop order)
        return 1000.0 if s["k0"]["unroll"] == 4 else true_cost(s)

    calls: list = []

    def evaluate(s):
        calls.append(s)
        return fake(s)

    ranked = sorted(({"k0": {"tile": t, "unroll": u}, "k1": {"vec": v}}
                     for t in TABLE["k0"]["tile"] for u in TABLE["k0"]["unroll"]
                     for v in TABLE["k1"]["vec"]), key=predict)
    search(TABLE, evaluate, budget=40, ranked=ranked[:40], predict=predict)
    assert all(s["k0"]["unroll"] != 4 for s in calls[2:])  # past the model's pick, default


def test_plan_ranks_legal_distinct_code() -> None:
    x = In("x", (("i", 64), ("n", 256)))
    low = lower(Sum("n", exp(x)), ("i",))
    found = plan(low, T, budget=12)
    assert found.ranked is not None and found.model is not None and found.predict is not None
    assert len(found.ranked) == 12
    from kernelsat.hardware.knobs import is_legal

    assert all(is_legal(found.table, s) for s in found.ranked)
    codes = {found.model.identity(0, codegen_knobs(low, s)[0]) for s in found.ranked}
    assert len(codes) == len(found.ranked)  # no two ranked settings give the same code
    preds = [found.predict(s) for s in found.ranked]
    from kernelsat.hardware.knobs import NEAR_DEFAULT

    knobs = len(found.table[next(iter(found.table))])  # ties go nearer the default
    assert preds[0] <= min(preds) * (1 + NEAR_DEFAULT * knobs)
