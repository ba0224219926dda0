"""`radixkv generate` end to end on tiny-llama (CPU), its argument errors, and the GPU
check script's CPU dry run."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from radixkv.cli import main

ROOT = Path(__file__).resolve().parents[1]
BASE = ["generate", "--model", "tiny-llama", "--device", "cpu"]


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def totals(out: str) -> dict[str, float]:
    line = next(ln for ln in out.splitlines() if ln.startswith("totals:"))
    m = re.search(r"requests (\d+) .* cached tokens ([\d,]+) .* hit rate ([\d.]+)% .* "
                  r"prefill tokens computed ([\d,]+) .* wall ([\d.]+) s", line)
    assert m, line
    req, cached, hit, prefill, wall = m.groups()
    return dict(requests=int(req), cached=int(cached.replace(",", "")), hit=float(hit),
                prefill=int(prefill.replace(",", "")), wall=float(wall))


def test_support_workload_hits(capsys):
    assert main(BASE + ["--workload", "support", "--users", "4", "--turns", "2"]) == 0
    out = capsys.readouterr().out
    t = totals(out)
    assert t["requests"] == 10 and t["hit"] > 0 and t["cached"] > 0 and t["wall"] > 0
    assert "support-u3-t1" in out


def test_no_cache_and_paged_options(capsys):
    argv = ["--workload", "support", "--users", "2", "--turns", "2", "--chunked-prefill-size", "64"]
    assert main(BASE + argv + ["--cache", "none"]) == 0
    none = totals(capsys.readouterr().out)
    assert none["hit"] == 0 and none["cached"] == 0
    assert main(BASE + argv + ["--page-size", "16", "--max-total-tokens", "4000"]) == 0
    paged = totals(capsys.readouterr().out)
    assert paged["hit"] > 0 and paged["prefill"] < none["prefill"]


def test_text_prompts_are_decoded(tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_text("You are a helpful agent. Question one?\n\nYou are a helpful agent. Question two?\n")
    assert main(BASE + ["--prompts", str(f), "--max-new-tokens", "4", "--temperature", "0.8",
                        "--top-k", "20", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert totals(out)["requests"] == 2 and "output" in out and "p1" in out


def test_jsonl_prompts(tmp_path, capsys):
    f = tmp_path / "trace.jsonl"
    rows = [{"id": "a", "arrival": 0.0, "prompt": list(range(40)), "output_len": 3},
            {"id": "b", "arrival": 5.0, "prompt": list(range(30)) + [7, 7], "output": [1, 2]}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(BASE + ["--prompts", str(f)]) == 0
    t = totals(capsys.readouterr().out)
    assert t["requests"] == 2 and t["cached"] >= 29


@pytest.mark.parametrize("argv, message", [
    (["--model", "no-such-model", "--workload", "support"], "unknown model 'no-such-model'"),
    (["--model", "tiny-llama", "--prompts", "/nonexistent/prompts.txt"], "does not exist"),
    (["--model", "tiny-llama", "--workload", "support", "--users", "0"], "num_users"),
    (["--workload", "support", "--page-size", "16", "--chunked-prefill-size", "8"],
     "chunked prefill budget 8 is smaller than the page size 16"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert main(["generate", "--device", "cpu"] + argv) == 2
    err = capsys.readouterr().err
    assert "radixkv generate: error:" in err and message in err


def test_prompts_or_workload_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "tiny-llama"])
    assert e.value.code == 2 and "--prompts" in capsys.readouterr().err


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.long
def test_gpu_check_dry_run(tmp_path, capsys):
    out = tmp_path / "gpu.md"
    assert load_script("gpu_check").main(["--dry-run", "--out", str(out)]) == 0
    md = out.read_text()
    assert md.count("PASS") == 2 and "| radix (sdpa) |" in md and "| none (sdpa) |" in md and "1.00x" in md
    assert "| ttft_p50 |" in md and "| radix (paged) |" in md


def test_gpu_check_fails_fast_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert load_script("gpu_check").main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_device_steps_dry_run_times_every_point_with_both_backends(tmp_path):
    out = tmp_path / "steps.json"
    mod = load_script("bench_device_steps")
    assert mod.main(["measure", "--dry-run", "--reps", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    pts = doc["points"]
    shapes = {(p["kind"], tuple(p["shape"])) for p in pts}
    assert len(pts) == 2 * len(shapes) == 2 * 12 and doc["model"] == "tiny-llama"
    assert {p["backend"] for p in pts} == {"paged", "sdpa"}
    assert all("error" not in p and p["ms"] > 0 and len(p["runs_ms"]) == 1 for p in pts)
    assert ("prefill", (4, 8, 64)) in shapes and ("decode", (8, 64)) in shapes


def test_device_steps_compare_divides_by_the_vllm_table(tmp_path, capsys):
    pytest.importorskip("aiconfigurator_core")
    mod = load_script("bench_device_steps")
    pts = [{"backend": "sdpa", "kind": "decode", "shape": [8, 4096], "ms": 12.0, "graph_ms": 6.0},
           {"backend": "paged", "kind": "decode", "shape": [8, 4096],
            "error": "OutOfMemoryError: CUDA out of memory"}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"model": "llama-3-8b", "dtype": "bfloat16", "device": "x",
                                "torch": "t", "points": pts}))
    assert mod.main(["compare", str(path)]) == 0
    out = capsys.readouterr().out
    from aiconfigurator_core.sdk import EngineHandle
    from radixkv.sim.tables import AIC_MODELS, AIC_SYSTEMS, AIC_VERSIONS
    system = AIC_SYSTEMS["h200"]
    eng = EngineHandle.compile(AIC_MODELS["llama-3-8b"], system, "vllm",
                               backend_version=AIC_VERSIONS["vllm"][system], tp_size=1)
    ref = float(eng.decode_step_latency(8, 4096, 2))
    assert (f"| decode 8 x 4,096 | {ref:.1f} | OutOfMemoryError: CUDA out of memory | – | – | – "
            f"| 12.0 | {12 / ref:.2f} | 6.0 | {6 / ref:.2f} |") in out
    assert f"| sdpa | decode | 1 | {12 / ref:.2f} | {12 / ref:.2f} |" in out


def test_device_steps_fails_fast_without_cuda(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = tmp_path / "steps.json"
    assert load_script("bench_device_steps").main(["measure", "--out", str(out)]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err and not out.exists()
