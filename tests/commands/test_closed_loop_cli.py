"""--max-concurrency on compare and simulate: closed loop, recorded in the JSON metadata."""
from __future__ import annotations

import json

import pytest

from ._helpers import parse, run


def test_compare_closed_loop_writes_max_concurrency(tmp_path, capsys):
    out = tmp_path / "o"
    rc, text, err = run(capsys, "compare", "--limit", "60", "--max-concurrency", "8",
                        "--out", out)
    assert (rc, err) == (0, "")
    assert "closed loop, 8 clients" in text
    d = json.loads((out / "compare.json").read_text())
    assert d["max_concurrency"] == 8
    assert len(d["results"]) == 6 and all(r["details"]["requests"] == 60 for r in d["results"])
    tput = [r["throughput_tok_s"] for r in d["results"]]
    assert all(t > 0 for t in tput)
    # closed loop, the makespan follows the service, so the cache designs no longer tie
    assert len(set(tput)) > 1


def test_simulate_closed_loop_writes_max_concurrency(tmp_path, capsys):
    path = tmp_path / "s.json"
    rc, text, err = run(capsys, "simulate", "--max-concurrency", "4", "--limit", "30",
                        "--json", path)
    assert (rc, err) == (0, "")
    d = json.loads(path.read_text())
    assert d["max_concurrency"] == 4
    assert d["results"][0]["details"]["requests"] == 30


def test_open_loop_records_null(tmp_path, capsys):
    path = tmp_path / "s.json"
    assert run(capsys, "simulate", "--limit", "20", "--json", path)[0] == 0
    assert json.loads(path.read_text())["max_concurrency"] is None


def test_closed_loop_is_deterministic(tmp_path, capsys):
    rows = []
    for name in ("a.json", "b.json"):
        assert run(capsys, "simulate", "--max-concurrency", "3", "--limit", "25",
                   "--json", tmp_path / name)[0] == 0
        rows.append(json.loads((tmp_path / name).read_text())["results"])
    assert rows[0] == rows[1]


def test_default_is_open_loop():
    assert parse("compare").max_concurrency is None
    assert parse("simulate").max_concurrency is None


@pytest.mark.parametrize("cmd", ["compare", "simulate"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_max_concurrency_is_one_line_exit_2(tmp_path, capsys, cmd, value):
    argv = [cmd, "--limit", "5", "--max-concurrency", value]
    argv += ["--out", tmp_path / "o"] if cmd == "compare" else []
    rc, _, err = run(capsys, *argv)
    assert rc == 2
    assert err == f"radixkv {cmd}: error: --max-concurrency must be a positive int, got {value}\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd", ["compare", "simulate"])
def test_non_int_max_concurrency_is_one_line_exit_2(capsys, cmd):
    with pytest.raises(SystemExit) as e:
        run(capsys, cmd, "--max-concurrency", "two")
    assert e.value.code == 2
    assert capsys.readouterr().err == \
        f"radixkv {cmd}: error: argument --max-concurrency: invalid int value: 'two'\n"


@pytest.mark.parametrize("flag", [["--rate", "2"], ["--time-scale", "0.5"]])
def test_arrival_time_flags_are_refused_in_closed_loop(capsys, flag):
    rc, _, err = run(capsys, "simulate", "--limit", "5", "--max-concurrency", "2", *flag)
    assert rc == 2
    assert err == (f"radixkv simulate: error: {flag[0]} sets arrival times, which "
                   f"--max-concurrency replaces; give one or the other\n")

