"""A newcomer's path: the README's commands run as written and print what it shows, the README
stays a front door, and the library example in docs/python.md prints its figures."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON_DOC = ROOT / "docs" / "python.md"
RADIXKV = [sys.executable, "-m", "radixkv"]


def readme_commands() -> list[str]:
    """The `$ radixkv ...` lines of the README's text blocks, without their comments."""
    return [ln.split("$ ", 1)[1].split("  #")[0].strip()
            for ln in README.read_text().splitlines() if ln.startswith("$ radixkv ")]


def run(command: str, cwd: Path) -> str:
    args = shlex.split(command)
    assert args[0] == "radixkv"
    res = subprocess.run(RADIXKV + args[1:], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, f"{command}\n{res.stderr}"
    return res.stdout


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    for doc in ("docs/cli.md", "docs/traces.md", "docs/serving.md", "docs/python.md",
                "docs/structures.md"):
        assert f"({doc})" in text and (ROOT / doc).is_file(), doc
    for picture in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (ROOT / picture).is_file(), picture


def test_the_main_job_prints_the_rows_the_readme_shows(tmp_path):
    out = run("radixkv compare", tmp_path)
    shown = [ln for ln in README.read_text().splitlines() if re.match(r"│ \d ", ln)]
    assert len(shown) == 5
    for row in shown:
        assert any(ln.startswith(row[:row.index(" ...")]) for ln in out.splitlines()), row
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "compare.json", "compare.png", "timeline.png"}


def test_the_chat_log_replay_runs_as_written(tmp_path):
    commands = readme_commands()
    tokenizer, replay = commands[1], commands[2]
    assert tokenizer.startswith("radixkv tokenizer tok/") and "support_chat.jsonl" in replay
    run(tokenizer, tmp_path)
    out = run(replay.replace("tests/data/", f"{ROOT}/tests/data/"), tmp_path)
    for figure in ("hit tokens", "hit rate"):
        shown = next(ln for ln in README.read_text().splitlines() if f"│ {figure} " in ln)
        assert shown in out.splitlines(), figure
    hits = next(ln for ln in out.splitlines() if "hit tokens" in ln)
    assert [c.strip() for c in hits.split("│")[2:5]] == ["3,212", "3,152", "0"]


def test_the_example_chat_log_is_a_chat_log():
    lines = (ROOT / "tests" / "data" / "support_chat.jsonl").read_text().splitlines()
    assert len(lines) == 10
    for ln in lines:
        rec = json.loads(ln)
        assert rec["messages"][0]["role"] == "system"
        assert rec["messages"][-1]["role"] == "assistant"


def test_the_sweep_runs_as_written(tmp_path):
    sweep = next(c for c in readme_commands() if c.startswith("radixkv sweep"))
    out = run(sweep, tmp_path)
    assert "unlimited cache: radix p1: 84.5%, blockhash b16: 84.3%" in out


@pytest.fixture
def python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", PYTHON_DOC.read_text(), re.S)
    assert len(blocks) == 3, "docs/python.md: the worked example, the API tour, the abilities"
    return blocks[0]


def test_the_worked_example_stores_4343_and_matches_2055(python_example, capsys):
    exec(compile(python_example, str(PYTHON_DOC), "exec"), {"__name__": "python_doc"})
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["matched 0", "matched 2,055", "matched 512", "stored 4,343"]
    evicted, stored = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+", out[4]))
    assert (evicted, stored) == (300, 4343 - 300)     # page granularity: exactly what is asked


def test_the_api_tour_runs(capsys):
    tour = re.findall(r"```python\n(.*?)```", PYTHON_DOC.read_text(), re.S)[1]
    exec(compile(tour, str(PYTHON_DOC), "exec"), {"__name__": "python_doc"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("radix p16 lru ") and out[0].split()[3].endswith("%")
    assert len(out) == 2 and 0 < float(out[1].split()[0]) <= 1


def test_the_abilities_example_prints_what_the_doc_shows(capsys):
    doc = PYTHON_DOC.read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)[2]
    shown = re.findall(r"It prints:\n\n```\n(.*?)```", doc, re.S)[0]
    exec(compile(code, str(PYTHON_DOC), "exec"), {"__name__": "python_doc"})
    assert capsys.readouterr().out == shown
