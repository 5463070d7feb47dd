"""The checker stands alone: `python -m kernelsat.proofs.checker CERT [--spec FILE] [-p K=V]`
answers ACCEPTED (exit 0) or REJECTED (exit 1), 2 for a file it cannot use, never a
traceback, and loads neither egglog nor z3 (nor the e-graph, nor the rule verifiers):
its rule library is the shipped rule files, hashed as the verified library is. The
`kernelsat verify` command is the same check. docs/proofs.md states the size of the
trusted base, and a test keeps those numbers true."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kernelsat
from kernelsat.proofs.certificate import Certificate
from kernelsat.proofs.checker import main, shipped_library
from kernelsat.sexpr import to_sexpr

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(certs: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("standalone")
    obj = certs.obj("softmax")
    out = {"cert": d / "cert.json", "tampered": d / "tampered.json", "bad.ks": d / "bad.ks",
           "mine.ks": d / "mine.ks", "spec.sexpr": d / "spec.sexpr", "old": d / "old.json"}
    out["cert"].write_text(certs.text("softmax"))
    tampered = json.loads(json.dumps(obj))
    tampered["spec"]["params"] = {"M": 4, "N": 16}
    out["tampered"].write_text(json.dumps(tampered))
    old = json.loads(json.dumps(obj))
    old["format"] = "kernelsat-certificate/1"
    out["old"].write_text(json.dumps(old))
    out["bad.ks"].write_text("kernel k(N=4)\nin X[i:N] f32\nout Y[i] = exp(X[i]\n")
    out["mine.ks"].write_text("# my softmax\n" + certs.spec_text("softmax").replace(",", " ,"))
    out["spec.sexpr"].write_text(to_sexpr(Certificate.from_json(certs.text("softmax")).spec))
    return out


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_verdicts_and_exit_codes(files: dict[str, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    cert, softmax = str(files["cert"]), str(ROOT / "specs" / "softmax.ks")
    cases: list[tuple[list[str], int, str]] = [
        ([cert], 0, "ACCEPTED: 4 steps replay from the spec (kernel softmax(M=4, N=8))"),
        ([cert, "--spec", softmax, "-p", "M=4", "-p", "N=8"], 0, "ACCEPTED"),
        ([cert, "--spec", str(files["mine.ks"]), "-p", "M=4", "-p", "N=8"], 0, "ACCEPTED"),
        ([cert, "--spec", str(files["spec.sexpr"])], 0, "ACCEPTED"),
        ([cert, "--spec", softmax], 1,
         "REJECTED: the certificate is about kernel softmax(M=4, N=8), not "
         f"{softmax} (kernel softmax(M=4096, N=1024))"),
        ([cert, "--spec", softmax, "-p", "N=8"], 1, "(kernel softmax(M=4096, N=8))"),
        ([cert, "--spec", str(ROOT / "specs" / "logsumexp.ks"), "-p", "M=4", "-p", "N=8"], 1,
         "not " + str(ROOT / "specs" / "logsumexp.ks")),
        ([str(files["tampered"])], 1, "REJECTED: spec.term is not the term that spec.text"),
        ([str(files["old"])], 1, "REJECTED: format kernelsat-certificate/1 does not bind"),
    ]
    for argv, want_code, want_text in cases:
        code, out, err = run_main(capsys, *argv)
        assert (code, err) == (want_code, ""), (argv, code, out, err)
        assert want_text in out, (argv, out)
        assert out.count("\n") == 1 and out.startswith(("ACCEPTED", "REJECTED"))


def test_files_it_cannot_use(files: dict[str, Path], capsys: pytest.CaptureFixture[str],
                             tmp_path: Path) -> None:
    cert, softmax = str(files["cert"]), str(ROOT / "specs" / "softmax.ks")
    cases: list[tuple[list[str], str]] = [
        ([str(tmp_path / "none.json")], "none.json: cannot read"),
        ([cert, "-p", "N=8"], "-p sets the sizes of --spec FILE"),
        ([cert, "--spec", str(tmp_path / "none.ks")], "none.ks: cannot read"),
        ([cert, "--spec", str(files["bad.ks"])], "bad.ks:3:"),
        ([cert, "--spec", softmax, "-p", "N=big"], "bad parameter 'N=big'"),
        ([cert, "--spec", softmax, "-p", "Q=3"], "unknown parameter 'Q'"),
        ([cert, "--spec", softmax, "-p", "N=0"], "N=0"),
        ([cert, "--spec", str(files["spec.sexpr"]), "-p", "N=8"], "a .sexpr term has none"),
        ([], "the following arguments are required: cert"),
    ]
    for argv, want in cases:
        code, out, err = run_main(capsys, *argv)
        assert code == 2 and out == "", (argv, code, out, err)
        assert want in err, (argv, err)


def test_a_certificate_that_is_not_utf8_or_not_json(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "half.json").write_text('{"format": "kernelsat-certificate/2", "spec": ')
    assert run_main(capsys, str(tmp_path / "bin.json"))[0] == 2
    code, out, _ = run_main(capsys, str(tmp_path / "half.json"))
    assert code == 1 and out.startswith("REJECTED: not valid JSON")


FORBIDDEN = ("z3", "egglog", "kernelsat.egraph", "kernelsat.extract", "kernelsat.proofs.verify",
             "kernelsat.proofs.axioms", "kernelsat.proofs.normalize", "kernelsat.hardware",
             "kernelsat.codegen")


def test_python_dash_m_runs_without_z3_or_egglog(files: dict[str, Path]) -> None:
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['checker', {str(files['cert'])!r}, '--spec', "
        f"{str(ROOT / 'specs' / 'softmax.ks')!r}, '-p', 'M=4', '-p', 'N=8']\n"
        "try:\n"
        "    runpy.run_module('kernelsat.proofs.checker', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    status = e.code\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}))\n"
        "print(json.dumps({'status': status, 'loaded': bad}))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    verdict, report = res.stdout.strip().splitlines()
    assert verdict.startswith("ACCEPTED")
    assert json.loads(report) == {"status": 0, "loaded": []}
    assert res.stderr == ""  # no warnings either


def test_the_real_module_entry_point(files: dict[str, Path]) -> None:
    for cert, want in ((files["cert"], 0), (files["tampered"], 1)):
        res = subprocess.run([sys.executable, "-m", "kernelsat.proofs.checker", str(cert)],
                             capture_output=True, text=True, check=False, timeout=120)
        assert (res.returncode, res.stderr) == (want, ""), res
        assert res.stdout.startswith("ACCEPTED" if want == 0 else "REJECTED")


@pytest.mark.slow  # verifies the library with z3 when the verification cache is cold
def test_shipped_rule_files_are_the_verified_library() -> None:
    from kernelsat.proofs.library import load_library

    verified = load_library()
    shipped = shipped_library()
    assert shipped.hash == verified.hash
    assert [r.text() for r in shipped.rules] == [r.text() for r in verified.rules]


def test_kernelsat_verify_is_the_same_check(files: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelsat.cli import app

    run = CliRunner().invoke
    cert, softmax = str(files["cert"]), str(ROOT / "specs" / "softmax.ks")
    res = run(app, ["verify", cert, "--spec", softmax, "-p", "M=4", "-p", "N=8"])
    assert res.exit_code == 0 and res.output.startswith("ACCEPTED"), res.output
    res = run(app, ["verify", cert, "--spec", softmax])
    assert res.exit_code == 1 and "not " + softmax in res.output
    res = run(app, ["verify", str(files["tampered"])])
    assert res.exit_code == 1 and res.output.startswith("REJECTED: spec.term is not")
    res = run(app, ["verify", cert, "-p", "N=8"])
    assert res.exit_code == 2 and "name the spec file too" in res.output
    (tmp_path / "other.sexpr").write_text("(In X i:4 n:8)")
    res = run(app, ["verify", cert, "--program", str(tmp_path / "other.sexpr")])
    assert res.exit_code == 1 and "another program than the one given" in res.output


# -- the trusted base, as docs/proofs.md states it ------------------------------------------

DOC = ROOT / "docs" / "proofs.md"
ROW = re.compile(r"^\| `([^`]+)` \| (\d+) \|", re.M)
TOTAL = re.compile(r"(\d[\d,]*) lines in all")


def counted(doc: str) -> str:
    """`doc` with every `| `path` | lines |` row of "What you trust" set to the file's
    `wc -l` now (a glob sums its files), and "N lines in all" to their sum."""
    start = doc.index("## What you trust")
    end = doc.index("\n## ", start + 3)
    total = 0

    def row(m: re.Match[str]) -> str:
        nonlocal total
        files = sorted(ROOT.glob(m.group(1)))
        assert files, f"{m.group(1)}: no such file"
        lines = sum(f.read_bytes().count(b"\n") for f in files)
        total += lines
        return f"| `{m.group(1)}` | {lines} |"

    section = ROW.sub(row, doc[start:end])
    assert total > 0 and TOTAL.search(section), "the section lists files and 'N lines in all'"
    section = TOTAL.sub(f"{total} lines in all", section)
    return doc[:start] + section + doc[end:]


def test_trusted_base_line_counts_in_the_docs() -> None:
    """The line counts in docs/proofs.md are true now. To update them after a change:
    `.venv/bin/python tests/adversarial/test_checker_standalone.py`."""
    doc = DOC.read_text()
    assert len(ROW.findall(doc)) >= 15
    fixed = counted(doc)
    stale = [f"{a.strip()}  ->  {b.strip()}" for a, b in
             zip(doc.splitlines(), fixed.splitlines(), strict=True) if a != b]
    assert not stale, ("docs/proofs.md 'What you trust' is stale (run this file as a "
                       "script to update it):\n" + "\n".join(stale))


def test_library_api_takes_the_users_spec(files: dict[str, Path]) -> None:
    text, softmax = files["cert"].read_text(), str(ROOT / "specs" / "softmax.ks")
    assert kernelsat.verify(text, spec=kernelsat.load_spec(softmax, {"M": 4, "N": 8})).accepted
    result = kernelsat.verify(text, spec=kernelsat.load_spec(softmax))
    assert not result.accepted and "not the given spec" in result.reason
    final = Certificate.from_json(text).final
    assert kernelsat.verify(text, program=final).accepted
    assert not kernelsat.verify(text, program=final.args[0]).accepted


if __name__ == "__main__":
    DOC.write_text(counted(DOC.read_text()))
    print(f"updated the line counts of {DOC}")
