"""CLI commands of the learned extractor: `corpus`, `train`, `evaluate`."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from kernelsat.driver.commands.backend_options import (
    BackendOption,
    RayAddressOption,
    open_backend,
    usable_cache_dir,
)
from kernelsat.driver.commands.options import float_option, int_option, seed_option
from kernelsat.driver.commands.rules import announce_verification
from kernelsat.driver.commands.spec import bundled_specs, fail, refuse
from kernelsat.driver.outputs import (
    OutputError,
    commit_output_dir,
    plan_output_dir,
    plan_output_file,
    write_file_atomically,
)
from kernelsat.learning.corpus import generate
from kernelsat.learning.rl_eval import EVAL_OPTIONS, table
from kernelsat.learning.rl_eval import evaluate as evaluate_policy
from kernelsat.learning.rl_rollouts import default_workers
from kernelsat.learning.rl_train import REWARDS, TRAIN_OPTIONS, TrainConfig
from kernelsat.learning.rl_train import train as train_policy


def register(app: typer.Typer) -> None:
    """Add `corpus`, `train` and `evaluate` to the kernelsat CLI."""

    @app.command("corpus")
    def corpus(
        out: Annotated[Path, typer.Argument(help="Folder to write the specs into.")],
        count: Annotated[int, int_option("Number of specs.")] = 32,
        seed: Annotated[int, seed_option("Seed of the generator.")] = 0,
        force: Annotated[bool, typer.Option(
            "--force", help="Replace OUT if it holds a previous kernelsat output (only the "
            "files kernelsat wrote).")] = False,
    ) -> None:
        """Generate training specs (varied sizes, op chains, reductions, fusions) into a
        new folder (the same rules as `optimize --out`: never over files of yours)."""
        try:
            plan = plan_output_dir(out, force=force)
            specs = {f"{name}.ks": text for name, text in generate(count, seed)}
            commit_output_dir(plan, specs)
        except OutputError as e:
            refuse(str(e))
        typer.echo(f"wrote {len(specs)} specs to {out}")

    @app.command("train")
    def train(
        corpus: Annotated[Path, typer.Option(help="Folder of training specs (.ks).")],
        out: Annotated[Path, typer.Option("--out", "-o", help="Checkpoint to write (.npz).")],
        target: Annotated[str, typer.Option("--target", "-t", help="c or numpy.")] = "c",
        episodes: Annotated[int, int_option("Episodes to run.")] = 400,
        batch: Annotated[int, int_option("Episodes per update.")] = 8,
        lr: Annotated[float, float_option("Adam learning rate (> 0).", positive=True)] = 0.01,
        entropy: Annotated[float, float_option("Entropy bonus.", minimum=0.0)] = 0.01,
        hidden: Annotated[int, int_option("Hidden units of the scorer.")] = 32,
        seed: Annotated[int, seed_option("Seed (rollouts, initialization).")] = 0,
        resume: Annotated[bool, typer.Option(help="Continue from --out if it exists.")] = False,
        max_seconds: Annotated[float, float_option(
            "Stop after this long (s; inf: no limit).", positive=True, allow_inf=True)
        ] = math.inf,
        knob_budget: Annotated[int, int_option("Knob settings per program.")] = 1,
        cache_dir: Annotated[Path | None, typer.Option(help="Measurement cache folder.")] = None,
        workers: Annotated[int | None, int_option(
            "Processes rolling out and proving a batch (default: one per core); "
            "measurements always run one at a time.")] = None,
        joint: Annotated[bool, typer.Option(
            help="One policy over program and knob setting: each episode also picks the "
            "setting, timed once at exactly it (--no-joint: programs only, knob search)."
        )] = True,
        reward: Annotated[str, typer.Option(
            help="Reward shape: log-clip (log(t_eager/t) clipped to +-clip) or rank (of "
            "the time among the spec's measured pairs).")] = "log-clip",
        clip: Annotated[float, float_option("Bound of the log-clip reward (> 0).",
                                            positive=True)] = 1.0,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
    ) -> None:
        """Train the extraction policy on CORPUS with measured, proof-gated rewards."""
        if reward not in REWARDS:
            fail(f"error: --reward {reward!r}: expected one of {', '.join(REWARDS)}")
        try:  # before any work: never over an input, a folder or through a link
            plan_output_file(out, force=True, protect=[corpus])
        except OutputError as e:
            refuse(str(e))
        announce_verification()
        start = time.monotonic()

        def progress(message: str) -> None:
            typer.echo(f"[{time.monotonic() - start:6.1f}s] {message}", err=True)

        with usable_cache_dir(cache_dir) as cache, open_backend(backend, ray_address,
                                                                cache) as runner:
            try:
                result = train_policy(
                    corpus, out, episodes=episodes,
                    ms=replace(TRAIN_OPTIONS, target=target, knob_budget=knob_budget),
                    cfg=TrainConfig(batch=batch, lr=lr, beta=entropy, hidden=hidden, seed=seed,
                                    reward=reward, clip=clip),
                    backend=runner, resume=resume, cache_dir=cache, max_seconds=max_seconds,
                    workers=workers if workers is not None else default_workers(),
                    joint=joint, progress=progress)
            except ValueError as e:  # no usable spec in the corpus
                fail(f"error: {e}")
        typer.echo(f"trained {result['episodes']} episodes, {result['measurements']} "
                   f"measurements, {result['seconds']:.0f}s -> {result['checkpoint']} "
                   f"(curve: {out.with_suffix('.curve.png')}, {out.with_suffix('.curve.csv')})")

    @app.command("evaluate")
    def evaluate(
        specs: Annotated[Path | None, typer.Option(
            help="Folder of held-out specs (default: the bundled examples).")] = None,
        target: Annotated[str, typer.Option("--target", "-t", help="c or numpy.")] = "c",
        budget: Annotated[int, int_option("Measurements K for rl and sample.")] = 8,
        reference: Annotated[int, int_option(
            "Extra programs for the reference.", minimum=0)] = 200,
        small: Annotated[int | None, int_option(
            "Cap every size parameter (fast runs), e.g. --small 128.")] = None,
        only: Annotated[list[str] | None, typer.Option(help="Spec names to run.")] = None,
        checkpoint: Annotated[Path | None, typer.Option(
            help="The policy checkpoint (.npz); default: the shipped one.")] = None,
        cold: Annotated[bool, typer.Option(help="Also the numpy cold-start column.")] = True,
        cold_reference: Annotated[int, int_option(
            "Reference programs measured on numpy for the cold-start column.", minimum=0)] = 48,
        out: Annotated[Path | None, typer.Option(
            "--out", "-o", help="Write the table (Markdown) and, beside it (.jsonl), each "
            "finished spec: running again with the same settings resumes.")] = None,
        cache_dir: Annotated[Path | None, typer.Option(help="Measurement cache folder.")] = None,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
    ) -> None:
        """Regret of rl, sample, greedy and ilp against a large-budget search, per spec."""
        if specs is None:
            paths = sorted(p for name, p in bundled_specs().items() if not only or name in only)
        else:
            paths = sorted(p for p in specs.glob("*.ks") if not only or p.stem in only)
        if not paths:
            fail(f"error: no spec (.ks) in {specs or 'the bundled examples'}"
                 + (f" named {', '.join(only)}" if only else ""))
        if out is not None:
            try:  # before any work: never over an input, a folder or through a link
                inputs = [*paths, *([checkpoint] if checkpoint else [])]
                plan_output_file(out, force=True, protect=inputs)
            except OutputError as e:
                refuse(str(e))
        announce_verification()
        with usable_cache_dir(cache_dir) as cache, open_backend(backend, ray_address,
                                                                cache) as runner:
            try:
                rows, colds = evaluate_policy(
                    paths, budget=budget, reference=reference, cap=small, checkpoint=checkpoint,
                    backend=runner, cold=cold, cold_reference=cold_reference, cache_dir=cache,
                    ms=replace(EVAL_OPTIONS, target=target),
                    log=out.with_suffix(".jsonl") if out is not None else None,
                    progress=lambda m: typer.echo(m, err=True))
            except ValueError as e:  # a log written with other settings
                fail(f"error: {e}")
        text = table(rows, colds, budget)
        typer.echo(text)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomically(out, text + "\n")
