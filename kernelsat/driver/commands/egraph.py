"""CLI commands of the egraph stage: `saturate`.

`kernelsat saturate SPEC [--iters N --nodes N --seconds S] [-p K=V] [--json-out OUT.json]
[--dot OUT.dot]` saturates the spec's term under the rule library and prints the report.
(`--json` alone means "print JSON" on other commands; `--json FILE` is kept, hidden, as
the old name of `--json-out`.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.driver.commands.options import float_option, int_option
from kernelsat.driver.commands.rules import announce_verification
from kernelsat.driver.commands.spec import ParamsOption, SpecArg, fail, load_or_exit
from kernelsat.driver.outputs import OutputError, plan_output_file, write_file_atomically
from kernelsat.driver.pipeline import Options
from kernelsat.egraph.saturate import (
    DEFAULT_NODES,
    DEFAULT_SCHEDULE,
    DEFAULT_SECONDS,
    scheduled_rules,
)
from kernelsat.egraph.saturate import saturate as run_saturation
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.proofs.library import load_library
from kernelsat.rewrites.rule import RuleError, parse_rules
from kernelsat.spec import read_source

DOT_LIMIT = 400
"""`--dot` refuses e-graphs with more e-nodes than this (Graphviz would be unreadable)."""


def parse_factors(text: str) -> tuple[int, ...]:
    """`"64,16"` -> `(64, 16)`; raises `typer.BadParameter` on anything but integers >= 2.

    >>> parse_factors(" 64, 16 ")
    (64, 16)
    """
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            factor = int(item)
        except ValueError:
            raise typer.BadParameter(
                f"{item.strip()!r} is not an integer; expected comma-separated integers >= 2, "
                "e.g. 64,16") from None
        if factor < 2:
            raise typer.BadParameter(f"{factor} cannot split an axis; expected integers >= 2")
        out.append(factor)
    return tuple(out)


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """A JSON-ready view of a snapshot: nodes, classes, shapes, root and firing log."""
    return {
        "root": snap.root,
        "nodes": [
            {
                "op": n.op.value,
                "attrs": list(n.attrs),
                "children": list(n.children),
                "class": int(snap.node_class[i]),
            }
            for i, n in enumerate(snap.nodes)
        ],
        "classes": [list(c) for c in snap.classes],
        "class_shape": [dict(s) for s in snap.class_shape],
        "firings": [
            {
                "rule": f.rule,
                "direction": f.direction,
                "root": f.root,
                "bindings": dict(f.bindings),
                "term_vars": sorted(f.term_vars),
            }
            for f in snap.firings
        ],
    }


def _dot_label(op: str, attrs: tuple[Any, ...]) -> str:
    if op == "In":
        return f"In {attrs[0]}"
    return " ".join([op, *map(str, attrs)])


def snapshot_dot(snap: Snapshot) -> str:
    """The e-graph in Graphviz: one cluster per class, edges from nodes to child classes."""
    lines = ["digraph egraph {", "  compound=true;", "  node [shape=box, fontsize=10];"]
    for c, members in enumerate(snap.classes):
        style = ' color="red" label="root"' if c == snap.root else f' label="c{c}"'
        lines.append(f"  subgraph cluster_{c} {{{style};")
        for n in members:
            label = _dot_label(snap.nodes[n].op.value, snap.nodes[n].attrs).replace('"', "'")
            lines.append(f'    n{n} [label="{label}"];')
        lines.append("  }")
    for n, node in enumerate(snap.nodes):
        for k in node.children:
            head = snap.classes[k][0]
            lines.append(f"  n{n} -> n{head} [lhead=cluster_{k}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _load_rules(rules_file: Path | None) -> list[Any]:
    try:
        if rules_file is not None:
            return parse_rules(read_source(rules_file), str(rules_file))
        announce_verification()
        return list(load_library().rules)
    except OSError as e:
        fail(f"{rules_file}: cannot read: {e.strerror or e}")
    except (RuleError, ValueError) as e:  # SpecError: not UTF-8, with line and offset
        fail(str(e))


def parse_factors_option(value: str) -> str:
    """`--factors` is checked when parsed (exit 2 with the reason); the command re-reads it."""
    parse_factors(value)
    return value


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command()
    def saturate(
        spec: SpecArg,
        iters: Annotated[int, int_option("Iteration limit (per stage).")] = Options.iters,
        nodes: Annotated[int, int_option("E-node limit.")] = DEFAULT_NODES,
        seconds: Annotated[float, float_option(
            "Time limit (s, > 0).", positive=True)] = DEFAULT_SECONDS,
        param: ParamsOption = None,
        factors: Annotated[str, typer.Option(
            help="Candidate split factors, comma-separated integers >= 2.",
            callback=parse_factors_option)] = ",".join(map(str, Options.factors)),
        stage: Annotated[
            list[str] | None,
            typer.Option(
                help="A stage of families or rule names, comma-separated (repeatable, "
                "in order). Default: optimize's schedule (fusion and online "
                "reductions, then tiling), which leaves out the rules no stage "
                "names; with --stage, unnamed rules join the first stage."
            ),
        ] = None,
        rules: Annotated[
            Path | None, typer.Option(help="A .rules file instead of the library.")
        ] = None,
        json_out: Annotated[
            Path | None, typer.Option("--json-out", help="Write the e-graph as JSON to this "
                                      "file (`kernelsat extract` reads it).")
        ] = None,
        json_old: Annotated[
            Path | None, typer.Option("--json", hidden=True, help="Old name of --json-out.")
        ] = None,
        dot_out: Annotated[
            Path | None, typer.Option("--dot", help=f"Write Graphviz dot (≤ {DOT_LIMIT} e-nodes).")
        ] = None,
    ) -> None:
        """Saturate a spec's term under the rule library and report what happened."""
        program = load_or_exit(spec, param).program
        inputs = [Path(program.path), *([rules] if rules else [])]
        try:  # before any work: never over an input, a folder or through a link
            outs = [plan_output_file(p, force=True, protect=inputs, option=name)
                    for name, p in (("--json-out", json_out or json_old), ("--dot", dot_out))
                    if p is not None]
        except OutputError as e:
            fail(f"error: {e}")
        if len(set(outs)) < len(outs):
            fail("error: --json-out and --dot name the same file")
        factor_list = parse_factors(factors)
        rule_list = _load_rules(rules)
        schedule = [tuple(f.strip() for f in s.split(",") if f.strip()) for s in stage or []]
        if not schedule and rules is None:
            schedule = [tuple(s) for s in DEFAULT_SCHEDULE]
            rule_list = scheduled_rules(rule_list, schedule)
        res = run_saturation(
            program.term,
            rule_list,
            iters=iters,
            nodes=nodes,
            seconds=seconds,
            factors=factor_list,
            schedule=schedule or None,
        )
        typer.echo(f"{program.name}: {len(rule_list)} rules, {len(res.rendered)} rule directions")
        typer.echo(res.summary())
        json_out = json_out or json_old
        if json_out is not None:
            data = {
                "report": {
                    "stop_reason": res.stop_reason,
                    "seconds": res.seconds,
                    "iterations": [vars(i) | {"matches": dict(i.matches)} for i in res.iterations],
                    "firings": dict(res.firings),
                    "class_ids": dict(res.class_ids),
                },
                "egraph": snapshot_json(res.snapshot),
            }
            write_file_atomically(json_out, json.dumps(data))
            typer.echo(f"wrote {json_out}")
        if dot_out is not None:
            if res.n_nodes > DOT_LIMIT:
                fail(
                    f"not writing {dot_out}: {res.n_nodes} e-nodes > {DOT_LIMIT} "
                    "(lower --nodes or --iters)"
                )
            write_file_atomically(dot_out, snapshot_dot(res.snapshot))
            typer.echo(f"wrote {dot_out}")
