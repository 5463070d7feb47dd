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
from kernelsat.hardware.targets import get_target, target_names
from kernelsat.learning.corpus import generate
from kernelsat.learning.rl_eval import ADAPT, COLD_TARGETS, EVAL_OPTIONS, table
from kernelsat.learning.rl_eval import evaluate as evaluate_policy
from kernelsat.learning.rl_rollouts import default_workers
from kernelsat.learning.rl_train import REWARDS, TRAIN_OPTIONS, TrainConfig, eager_timer
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
        target: Annotated[str, typer.Option(
            "--target", "-t", help="Size the specs for this target (c, numpy, ...); "
            "'none': the draft sizes, unscaled.")] = "c",
        min_ms: Annotated[float, float_option(
            "Shortest eager time (ms) a spec is sized for.", positive=True)] = 1.0,
        max_ms: Annotated[float, float_option(
            "Longest eager time (ms) a spec is sized for.", positive=True)] = 20.0,
        calibrate: Annotated[bool, typer.Option(
            help="Time each spec's eager program (once, default knobs) and rescale until "
            "the MEASURED time is in the window (the estimate alone: off).")] = False,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
    ) -> None:
        """Generate training specs (varied sizes, op chains, reductions, fusions) into a
        new folder (the same rules as `optimize --out`: never over files of yours), each
        sized so its eager program takes MIN_MS-MAX_MS on the target (estimated, or
        measured with --calibrate)."""
        if not min_ms < max_ms:
            raise typer.BadParameter(f"{min_ms} must be below --max-ms {max_ms}",
                                     param_hint="--min-ms")
        try:
            hw = None if target == "none" else get_target(target)
        except (KeyError, ValueError) as e:
            raise typer.BadParameter(str(e).strip('"'), param_hint="--target") from None
        if calibrate and hw is None:
            raise typer.BadParameter("needs a --target (not none)", param_hint="--calibrate")
        window = (min_ms * 1e-3, max_ms * 1e-3)
        try:
            plan = plan_output_dir(out, force=force)
            if calibrate:
                with usable_cache_dir(None) as cache, open_backend(backend, ray_address,
                                                                   cache) as runner:
                    ms = replace(TRAIN_OPTIONS, target=target)
                    drafted = generate(count, seed, hw, window, eager_timer(ms, runner))
            else:
                drafted = generate(count, seed, hw, window)
            specs = {f"{name}.ks": text for name, text in drafted}
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
            "the time among the spec's measured pairs).", metavar="log-clip|rank")
        ] = "log-clip",
        clip: Annotated[float, float_option("Bound of the log-clip reward (> 0).",
                                            positive=True)] = 1.0,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
    ) -> None:
        """Train the extraction policy on CORPUS with measured, proof-gated rewards."""
        if reward not in REWARDS:
            raise typer.BadParameter(f"{reward!r}: expected one of {', '.join(REWARDS)}",
                                     param_hint="--reward")
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
        budget: Annotated[int, int_option(
            "Measurements K per method: (program, knob setting) pairs timed.")] = 8,
        reference: Annotated[int, int_option(
            "Pairs measured for the reference (all of them when fewer).", minimum=0)] = 200,
        small: Annotated[int | None, int_option(
            "Cap every size parameter (fast runs), e.g. --small 128.")] = None,
        only: Annotated[list[str] | None, typer.Option(help="Spec names to run.")] = None,
        checkpoint: Annotated[Path | None, typer.Option(
            help="The policy checkpoint (.npz); default: the shipped one.")] = None,
        cold: Annotated[bool, typer.Option(
            help="Also the cold start on targets absent from training.")] = True,
        cold_target: Annotated[list[str] | None, typer.Option(
            help=f"A cold-start target (repeatable; default: {', '.join(COLD_TARGETS)}).")
        ] = None,
        cold_reference: Annotated[int, int_option(
            "Reference pairs measured on each cold target.", minimum=0)] = 48,
        adapt: Annotated[int, int_option(
            "Measurements after the cold start's online update.", minimum=0)] = ADAPT,
        out: Annotated[Path | None, typer.Option(
            "--out", "-o", help="Write the table (Markdown) and, beside it (.jsonl), each "
            "finished spec: running again with the same settings resumes.")] = None,
        cache_dir: Annotated[Path | None, typer.Option(help="Measurement cache folder.")] = None,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
    ) -> None:
        """Regret of rl, sample, greedy and eager at K measurements against a large
        reference, per spec; then the cold start on unseen targets and its adaptation."""
        unknown = [t for t in [target, *(cold_target or [])] if t.lower() not in target_names()]
        if unknown:
            fail(f"error: unknown target {unknown[0]!r}; expected one of "
                 f"{', '.join(target_names())}")
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
                    backend=runner, cold_targets=(cold_target or COLD_TARGETS) if cold else (),
                    cold_reference=cold_reference, adapt=adapt, cache_dir=cache,
                    ms=replace(EVAL_OPTIONS, target=target),
                    log=out.with_suffix(".jsonl") if out is not None else None,
                    progress=lambda m: typer.echo(m, err=True))
            except ValueError as e:  # a log written with other settings
                fail(f"error: {e}")
        text = table(rows, colds, budget, adapt)
        typer.echo(text)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomically(out, text + "\n")
