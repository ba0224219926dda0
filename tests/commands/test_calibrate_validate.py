"""`radixkv calibrate` then `radixkv validate` on tiny-llama (CPU), and their one-line errors."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "p.json"
    assert main(["calibrate", "--model", "tiny-llama", "--device", "cpu", "--repeats", "1",
                 "--out", str(path)]) == 0
    return path


def test_calibrate_writes_a_profile(profile):
    doc = json.loads(profile.read_text())
    assert doc["model"]["name"] == "tiny-llama" and doc["device"] == "cpu"
    assert doc["dtype"] == "float32" and doc["backend"] == "sdpa"
    assert doc["machine"]["threads"] == 1 and doc["grid"]["repeats"] == 1
    assert doc["residuals"]["samples"] + doc["residuals"]["outliers"] == len(doc["samples"])
    assert min(doc["coefficients"].values()) >= 0 and doc["coefficients"]["step"] > 0


def test_validate_reports_each_metric(profile, tmp_path):
    out = tmp_path / "v.json"
    assert main(["validate", "--model", "tiny-llama", "--profile", str(profile), "support",
                 "--users", "3", "--turns", "2", "--seed", "5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["metrics"]) >= {"ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90", "makespan_s"}
    for m in doc["metrics"].values():
        assert m["real"] > 0 and m["simulated"] > 0
        assert m["relative_error"] == pytest.approx(m["simulated"] / m["real"] - 1)
    assert doc["units"] == {"real": "s", "simulated": "s", "relative_error": "fraction"}
    # the simulator with the profile: same command shape as any simulate run
    assert main(["simulate", "--profile", str(profile), "--users", "3", "--turns", "2",
                 "--vocab-size", "259"]) == 0


@pytest.mark.parametrize("argv, needle", [
    (["validate", "--profile", "{tmp}/missing.json", "support"], "missing.json' does not exist"),
    (["validate", "--model", "tiny-llama-4l", "--profile", "{profile}", "support"],
     "measured on model 'tiny-llama', not 'tiny-llama-4l'"),
    (["simulate", "--profile", "{profile}", "--gpu", "h200"], "--gpu h200 does not apply"),
    (["simulate", "--profile", "{bad}"], "is not valid JSON"),
    (["simulate", "--tp", "3"], "tp 3 does not divide"),
    (["calibrate", "--model", "nope", "--out", "{tmp}/x.json"], "unknown model 'nope'"),
])
def test_one_line_errors(profile, tmp_path, capsys, argv, needle):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    argv = [a.format(tmp=tmp_path, profile=profile, bad=bad) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"radixkv {argv[0]}: error:") and needle in err
