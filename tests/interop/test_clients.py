"""The peers' benchmark clients against one radixkv replica, each loading the served model's
tokenizer from `radixkv tokenizer`: aiperf's shared-prefix chat run with --reset-kv-cache (its
cache-read tokens equal the server's prefix-cache hits, and the reset reached the server once),
and guidellm's synchronous run (its prompt and cached tokens equal the server's counters)."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.interop.conftest import MODEL, counter, tool, workers

pytestmark = pytest.mark.interop

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
PROMPT_TOKENS, DONE = "vllm:prompt_tokens_total", "vllm:request_success_total"


def test_aiperf_shared_prefix_chat_with_a_cache_reset(tmp_path, tokenizer_dir):
    exe = tool("aiperf")
    with workers(1, tokens=60_000) as (w,):
        # a warm cache the reset must clear: aiperf's first request then hits nothing
        cmd = [exe, "profile", "--model", MODEL, "--url", w.url, "--endpoint-type", "chat",
               "--streaming", "--tokenizer", str(tokenizer_dir), "--request-count", "20",
               "--concurrency", "4", "--prompt-input-tokens-mean", "64",
               "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", "8",
               "--prompt-output-tokens-stddev", "0", "--shared-system-prompt-length", "512",
               "--reset-kv-cache", "--use-server-token-count", "--random-seed", "1",
               "--output-artifact-dir", str(tmp_path / "aiperf"), "--no-gpu-telemetry",
               "--no-auto-plot", "--request-timeout-seconds", "60"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        doc = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
        assert doc["request_count"]["avg"] == 20 and doc["error_summary"] == []
        read = doc["total_usage_prompt_cache_read_tokens"]["avg"]
        assert read == counter(w.url, HITS) > 0
        share = doc["overall_usage_prompt_cache_read_pct"]["avg"]
        assert abs(share - 100 * read / counter(w.url, QUERIES)) < 1e-6 and share > 50
        assert doc["usage_prompt_cache_read_tokens"]["min"] == 0          # the first, after the reset
        assert counter(w.url, "radixkv_cache_resets_total") == 1


def test_guidellm_synchronous_run(tmp_path, tokenizer_dir):
    exe = tool("guidellm")
    with workers(1, tokens=60_000) as (w,):
        out = tmp_path / "guidellm.json"
        cmd = [exe, "run", "--backend", f"kind=openai_http,target={w.url}",
               "--profile", "kind=synchronous", "--constraint", "kind=max_requests,count=10",
               "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=8",
               "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
               "--output", f"kind=json,path={out}", "--disable-console-interactive"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        bench = json.loads(out.read_text())["benchmarks"][0]
        assert bench["metrics"]["request_totals"] == {"successful": 10, "errored": 0,
                                                      "incomplete": 0, "total": 10}
        done = bench["requests"]["successful"]
        assert sum(r["prompt_tokens"] for r in done) == counter(w.url, PROMPT_TOKENS)
        assert sum(r["cached_tokens"] for r in done) == counter(w.url, HITS)
        assert [r["output_tokens"] for r in done] == [8] * 10 and counter(w.url, DONE) == 10
