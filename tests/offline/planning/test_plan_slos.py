"""`radixkv plan` with whichever SLOs are given, and its cost printed with a unit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixkv.cli import main
from radixkv.offline.planning.plan import SLO
from radixkv.offline.planning.runner import Outcome
from radixkv.workloads import make_workload, write_jsonl


def outcome(ttft, itl, e2e=None) -> Outcome:
    return Outcome(ttft, itl, e2e, 0.5, 10.0)


def test_a_target_not_given_is_not_checked():
    assert SLO(ttft_p99=1.0).meets(outcome(0.9, 5.0))          # ITL far off: not a target
    assert not SLO(ttft_p99=1.0).meets(outcome(1.1, 0.01))
    assert SLO(itl_p99=0.05).meets(outcome(30.0, 0.04))
    assert not SLO(itl_p99=0.05, e2e_p99=2.0).meets(outcome(0.1, 0.04, 2.5))
    assert not SLO(ttft_p99=1.0).meets(outcome(None, 0.01))     # a figure missing misses
    assert SLO(ttft_p99=2, itl_p99=0.05).describe() == "TTFT p99 ≤ 2 s, ITL p99 ≤ 0.05 s"


def test_no_slo_at_all_is_one_clear_error(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_jsonl(make_workload("fewshot", num_questions=4, rate=10.0), trace)
    assert main(["plan", str(trace), "--gpus", "h100-sxm", "--max-gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "give at least one SLO: --ttft-p99, --itl-p99 or --e2e-p99" in err
    with pytest.raises(ValueError, match="--itl-p99"):
        SLO(itl_p99=-1.0)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("slo") / "fewshot.jsonl"
    write_jsonl(make_workload("fewshot", num_questions=30, preamble_len=300,
                              question_len=(400, 800), output_len=(10, 30), rate=60.0), path)
    return path


def plan(trace: Path, out: Path, *flags: str) -> dict:
    argv = ["plan", str(trace), "--gpus", "h100-sxm", "--max-gpus", "2", "--tp", "1",
            "--modes", "aggregated", "--routers", "round-robin", "--workers", "1",
            "--json", str(out / "plan.json"), "--plot", str(out / "plan.png"), *flags]
    assert main(argv) == 0
    return json.loads((out / "plan.json").read_text())


def test_plan_runs_on_ttft_alone_and_prints_cost_per_hour(trace, tmp_path, capsys):
    doc = plan(trace, tmp_path, "--ttft-p99", "5")
    out = capsys.readouterr().out
    assert doc["slo"] == {"ttft_p99": 5.0, "itl_p99": None, "e2e_p99": None}
    assert "TTFT p99 ≤ 5 s" in out and "ITL p99 ≤" not in out
    assert "GPU-h (trace)" in out and "GPU-h / h of traffic" in out and "USD" not in out
    for r in doc["results"]:
        assert r["meets_slo"] == (r["ttft_p99"] is not None and r["ttft_p99"] <= 5.0)
        # an hour of traffic costs one GPU-hour per GPU at the default price
        assert r["cost_per_hour"] == pytest.approx(r["gpus"])


def test_a_price_prints_dollars(trace, tmp_path, capsys):
    doc = plan(trace, tmp_path, "--itl-p99", "1", "--price", "h100-sxm=2.5")
    out = capsys.readouterr().out
    assert "USD (trace)" in out and "USD / h of traffic" in out
    for r in doc["results"]:
        assert r["cost"] == pytest.approx(2.5 * r["gpu_hours"])
        assert r["cost_per_hour"] == pytest.approx(2.5 * r["gpus"])


@pytest.fixture(scope="module")
def hash_trace(tmp_path_factory) -> Path:
    """24 requests sharing three 64-token blocks, 200 ms apart (Mooncake's millisecond ids)."""
    path = tmp_path_factory.mktemp("ids") / "t.jsonl"
    lines = []
    for i in range(24):
        n = 3 + i % 6
        ids = [0, 1, 2] + [100 + 10 * i + j for j in range(n - 3)]
        lines.append(json.dumps({"timestamp": 200 * i, "input_length": 64 * n - 5,
                                 "output_length": 8, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cluster_args_reproduce_the_planned_row(hash_trace, tmp_path, capsys):
    doc = plan(hash_trace, tmp_path, "--ttft-p99", "5", "--trace-block-size", "64",
               "--time-scale", "0.5")
    row = doc["results"][0]
    args = row["cluster_args"]
    assert args[:5] == [str(hash_trace), "--trace-block-size", "64", "--time-scale", "0.5"]
    out = tmp_path / "cluster.json"
    assert main(["cluster", *args, "--json", str(out)]) == 0
    (got,) = json.loads(out.read_text())["results"]
    assert got["ttft_p99"] == row["ttft_p99"] and got["hit_rate"] == row["hit_rate"]


def test_the_suggested_engines_serve_the_model_simulated(trace, tmp_path, capsys):
    plan(trace, tmp_path, "--ttft-p99", "5")
    out = capsys.readouterr().out
    assert "vllm serve meta-llama/Meta-Llama-3-8B " in out
    assert "--model-path meta-llama/Meta-Llama-3-8B " in out and "3.1" not in out
