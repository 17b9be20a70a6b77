"""The bad-input corpus (tests/data/bad_inputs/cases.yaml): malformed cluster specs, sweep and launch YAMLs
and CLI invocations, data that does not fit its job, YAML bombs, addresses and non-finite numbers. Each
exits 2 with one line naming what is wrong, no traceback, and writes nothing.

Cases run through the CLI's own `main` in this process (a subprocess each would spend ~3 s importing); an
unexpected exception would escape `main` and fail the test just as a traceback would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import DATA, REPO

from orchestrator.cli import main

CORPUS = DATA / "bad_inputs"
CASES = yaml.safe_load((CORPUS / "cases.yaml").read_text())
COMMAND = {"cluster": ["cluster", "validate"], "sweep": ["sweep", "--config"], "launch": ["launch", "--config"]}


def test_the_corpus_is_complete():
    files = sorted(p.name for p in CORPUS.glob("*.yaml") if p.name != "cases.yaml")
    assert files == sorted(CASES["files"])  # every file has its expected message, and no stale entries
    assert len(files) + len(CASES["cli"]) >= 100


def run_main(args: list[str], cwd: Path, capsys) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def check_refused(args: list[str], expect: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # runs/ and sweeps/ would land here
    code, out, err = run_main(args, tmp_path, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("orchestrator"), err
    assert expect in lines[0]
    assert "Traceback" not in err + out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(CASES["files"]))
def test_bad_file(name, tmp_path, capsys, monkeypatch):
    args = [*COMMAND[name.split("-", 1)[0]], str(CORPUS / name)]
    check_refused(args, CASES["files"][name], tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", CASES["cli"], ids=lambda case: " ".join(case["args"]))
def test_bad_invocation(case, tmp_path, capsys, monkeypatch):
    args = [str(REPO / a) if (REPO / a).exists() and "/" in a else a for a in case["args"]]
    check_refused(args, case["expect"], tmp_path, capsys, monkeypatch)
