"""--arrivals session and --think-time on simulate, compare, cluster and bench-serve: recorded
in the JSON when given, absent from it when not, and every bad value one line, exit 2."""
from __future__ import annotations

import json

import pytest

from ._helpers import parse, run

SMALL = ["multiturn", "--users", "4", "--turns", "3", "--max-total-tokens", "20000"]
COMMANDS = ["simulate", "compare", "cluster", "bench-serve"]


def _argv(cmd: str, tmp_path) -> list:
    """The command's required arguments around the small workload."""
    if cmd == "compare":
        return [cmd, *SMALL, "--config", "a:schedule-policy=lpm", "--out", tmp_path / "o"]
    if cmd == "cluster":
        return [cmd, *SMALL, "--replicas", "2", "--router", "round-robin", "--workers", "1"]
    if cmd == "bench-serve":
        return [cmd, "--base-url", "http://127.0.0.1:9", "multiturn", "--users", "2"]
    return [cmd, *SMALL]


def _json(cmd: str, tmp_path) -> tuple[list, object]:
    if cmd == "compare":
        return [], tmp_path / "o" / "compare.json"
    path = tmp_path / "r.json"
    return ["--json", path], path


@pytest.mark.parametrize("cmd", ["simulate", "compare", "cluster"])
def test_session_arrivals_run_and_are_recorded(tmp_path, capsys, cmd):
    extra, path = _json(cmd, tmp_path)
    rc, text, err = run(capsys, *_argv(cmd, tmp_path), "--arrivals", "session",
                        "--think-time", "exp:2", *extra)
    assert (rc, err) == (0, "")
    text = " ".join(text.split())                 # a table title may wrap
    assert "session arrivals" in text and "think time exp, mean 2 s" in text
    d = json.loads(path.read_text())
    assert (d["arrivals"], d["think_time"], d["think_time_distribution"]) == \
        ("session", 2.0, "exponential")
    assert all(r["details"]["requests"] == 12 for r in d["results"] if "details" in r)


@pytest.mark.parametrize("cmd", ["simulate", "compare", "cluster"])
def test_trace_arrivals_write_no_arrivals_keys(tmp_path, capsys, cmd):
    extra, path = _json(cmd, tmp_path)
    for i, mode in enumerate(([], ["--arrivals", "trace"])):
        rc, text, err = run(capsys, *_argv(cmd, tmp_path), *mode, *extra)
        assert (rc, err) == (0, "") and "session arrivals" not in text
        d = json.loads(path.read_text())
        assert not {"arrivals", "think_time", "think_time_distribution"} & set(d)
        if i == 0:
            first = d["results"]
    assert d["results"] == first                  # --arrivals trace is the default


def test_session_arrivals_change_the_run(tmp_path, capsys):
    rows = {}
    for name, mode in (("trace", []), ("session", ["--arrivals", "session"])):
        path = tmp_path / f"{name}.json"
        assert run(capsys, "simulate", *SMALL, *mode, "--json", path)[0] == 0
        rows[name] = json.loads(path.read_text())["results"][0]
    assert rows["trace"]["details"]["requests"] == rows["session"]["details"]["requests"]
    assert rows["trace"] != rows["session"]


def test_defaults():
    for argv in (["simulate"], ["compare"], ["cluster", "multiturn"],
                 ["bench-serve", "--base-url", "http://h:1", "multiturn"]):
        args = parse(*argv)
        assert (args.arrivals, args.think_time) == (None, None)


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("flags, message", [
    (["--arrivals", "burst"], "unknown --arrivals 'burst'; valid: trace, session"),
    (["--arrivals", "session", "--think-time", "soon"],
     "--think-time 'soon': expected SECONDS (a finite number >= 0) or exp:SECONDS "
     "(exponential with that mean)"),
    (["--arrivals", "session", "--think-time", "-1"],
     "--think-time '-1': expected SECONDS (a finite number >= 0) or exp:SECONDS "
     "(exponential with that mean)"),
    (["--arrivals", "session", "--think-time", "exp:nan"],
     "--think-time 'exp:nan': expected SECONDS (a finite number >= 0) or exp:SECONDS "
     "(exponential with that mean)"),
    (["--think-time", "3"], "--think-time applies to --arrivals session, not to --arrivals trace"),
    (["--arrivals", "trace", "--think-time", "3"],
     "--think-time applies to --arrivals session, not to --arrivals trace"),
])
def test_bad_values_are_one_line_exit_2(tmp_path, capsys, cmd, flags, message):
    rc, _, err = run(capsys, *_argv(cmd, tmp_path), *flags)
    assert rc == 2
    assert err == f"radixkv {cmd}: error: {message}\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd", ["simulate", "compare", "bench-serve"])
def test_session_arrivals_refuse_the_closed_loop(tmp_path, capsys, cmd):
    rc, _, err = run(capsys, *_argv(cmd, tmp_path), "--arrivals", "session",
                     "--max-concurrency", "4")
    assert rc == 2
    assert err == (f"radixkv {cmd}: error: --arrivals session is open loop and "
                   f"--max-concurrency closed loop; give one or the other\n")
