"""CLI command of the extract stage for any e-graph: `kernelsat extract FILE.json`.

`kernelsat extract FILE.json [--extractor greedy-dag|greedy-tree|ilp|local|sample]
[--time-limit S] [--root CLASS]... [--json]` reads an e-graph in the egraph-serialize
JSON format (egglog's serializer, extraction-gym) or kernelsat's own snapshot
(`kernelsat saturate SPEC --json-out F`), extracts every root with one shared choice and
prints the program, its tree and DAG cost, whether it is a valid extraction (acyclic,
one node per needed class, every child class covered), the status and the time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from kernelsat.driver.commands.options import float_option
from kernelsat.driver.commands.spec import fail
from kernelsat.extract import GRAPH_EXTRACTORS
from kernelsat.extract.base import ExtractionError
from kernelsat.extract.json_egraph import EGraphFormatError, extract_graph, load_egraph

METHODS = tuple(sorted(GRAPH_EXTRACTORS))
"""The extractors that read a foreign e-graph (the registry's graph-only ones)."""


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command("extract")
    def extract_cmd(
        file: Annotated[
            Path, typer.Argument(help="An e-graph as JSON (egraph-serialize or kernelsat).")
        ],
        extractor: Annotated[
            str, typer.Option("--extractor", "-e", help=f"One of: {', '.join(METHODS)}.")
        ] = "ilp",
        time_limit: Annotated[
            float,
            float_option("Seconds for the whole ILP extraction (> 0).", "--time-limit",
                         positive=True),
        ] = 10.0,
        root: Annotated[
            list[str] | None,
            typer.Option("--root", help="Extract this e-class (repeatable); default: the "
                         "file's root_eclasses."),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print one JSON object instead of text.")
        ] = False,
    ) -> None:
        """Extract the cheapest program from a JSON e-graph of any tool and check it."""
        # scipy (the ILP) loads only when the command runs, not with every CLI call

        if extractor not in METHODS:
            fail(f"unknown extractor {extractor!r}; choose one of: {', '.join(METHODS)}")
        options: dict[str, object] = {"time_limit": time_limit} if extractor == "ilp" else {}
        try:
            graph = load_egraph(file)
            roots = None if not root else [graph.class_named(r) for r in root]
            result = extract_graph(graph, extractor, roots, **options)
        except (EGraphFormatError, ExtractionError, ValueError) as e:
            fail(f"{file}: {e}" if not str(e).startswith(str(file)) else str(e))
        if as_json:
            typer.echo(json.dumps(result.to_json()))
        else:
            names = ", ".join(graph.class_ids[r] for r in result.roots)
            typer.echo(
                f"{file}: {graph.n_nodes} e-nodes, {graph.n_classes} e-classes; "
                f"roots: {names}"
            )
            for r in result.roots:
                typer.echo(f"{graph.class_ids[r]}: {result.program(r)}")
            gap = "" if result.gap is None else f", gap {result.gap:.3g}"
            typer.echo(f"tree cost: {_number(result.tree_cost)}")
            typer.echo(f"DAG cost:  {_number(result.dag_cost)} ({len(result.choice)} e-nodes)")
            typer.echo(
                "valid:     "
                + ("yes (acyclic, one node per needed class, every child class covered)"
                   if result.valid else f"NO: {result.invalid}")
            )
            typer.echo(f"status:    {result.method} {result.status}{gap}")
            typer.echo(f"time:      {result.seconds:.3f} s")
        if not result.valid:
            raise typer.Exit(1)
