"""Every bad input ends a command with one line on stderr and exit status 2 (Ctrl-C: 130),
before anything big is built and without leaving a partial output file. One regression test
per case, each asserting the exact line."""
from __future__ import annotations

import pytest
import torch

import radixkv.cache.pool
import radixkv.commands.generate
import radixkv.model.setup
from radixkv.workloads import write_jsonl, make_workload

from ._helpers import SMALL, hash_id_trace, run, write_lines

GENERATE = ["generate", "--device", "cpu"]


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def fails(capsys, *argv, line: str, status: int = 2) -> str:
    """Run; assert the status and that stderr is exactly `line`; return stdout."""
    rc, out, err = run(capsys, *argv)
    assert (rc, err) == (status, line + "\n")
    return out


def with_memory(monkeypatch, gib: int) -> None:
    """This machine has `gib` GiB available, for every check that asks."""
    for module in (radixkv.cache.pool, radixkv.model.setup):
        monkeypatch.setattr(module, "host_memory_bytes", lambda: gib * 2**30)


def test_generate_reads_a_workload_file(tmp_path, capsys):
    # "generator options ['seed'] do not apply" used to refuse every file
    path = tmp_path / "w.jsonl"
    write_jsonl(make_workload("multiturn", num_users=2, turns=2, msg_len=(4, 8),
                              reply_len=(2, 4), vocab_size=200), path)
    rc, out, err = run(capsys, *GENERATE, "--workload", path)
    assert (rc, err) == (0, "") and "totals: requests 4" in out
    trace = hash_id_trace(tmp_path / "h64.jsonl")
    rc, out, err = run(capsys, *GENERATE, "--workload", trace, "--trace-block-size", "64",
                       "--seed", "1")
    assert (rc, err) == (0, "") and "totals: requests 4" in out


@pytest.mark.parametrize("command", ["simulate", "compare", "replay", "generate"])
def test_empty_workload_is_refused(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    argv = [*GENERATE, "--workload"] if command == "generate" else [command]
    out = fails(capsys, *argv, "empty.jsonl",
                line=f"radixkv {command}: error: workload 'empty.jsonl' has no requests")
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


def test_all_lines_skipped_is_an_empty_workload(tmp_path, capsys):
    bad = write_lines(tmp_path / "bad.jsonl", ["{", "[1]"])
    fails(capsys, "replay", bad, "--skip-bad",
          line=f"radixkv replay: error: workload '{bad}' has no requests (2 bad lines skipped)")


@pytest.mark.parametrize("command", ["simulate", "replay"])
def test_json_into_a_folder_or_a_missing_folder(command, tmp_path, capsys):
    out = fails(capsys, command, "support", *SMALL, "--json", tmp_path,
                line=f"radixkv {command}: error: --json '{tmp_path}' is a folder; give a file name")
    assert out == ""
    target = tmp_path / "no" / "r.json"
    fails(capsys, command, "support", *SMALL, "--json", target,
          line=f"radixkv {command}: error: --json '{target}': the folder '{tmp_path / 'no'}' "
               f"does not exist")


def test_generate_json_into_a_folder(tmp_path, capsys):
    fails(capsys, *GENERATE, "--workload", "support", "--json", tmp_path,
          line=f"radixkv generate: error: --json '{tmp_path}' is a folder; give a file name")


def test_out_onto_a_file(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("mine")
    out = fails(capsys, "compare", *SMALL, "--out", f,
                line=f"radixkv compare: error: --out '{f}' is a file, not a folder")
    assert out == "" and f.read_text() == "mine"
    fails(capsys, "compare", *SMALL, "--out", f / "sub",
          line=f"radixkv compare: error: --out '{f / 'sub'}': '{f}' is a file, not a folder")


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_in_compare_leaves_no_file(existing, tmp_path, capsys, monkeypatch):
    out_dir = tmp_path / "out"
    if existing:
        out_dir.mkdir()
    written = []

    def interrupt(results, path, title=""):
        written.extend(sorted(p.name for p in path.parent.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr("radixkv.commands.compare.plot_timeline", interrupt)
    fails(capsys, "compare", *SMALL, "--out", out_dir, status=130,
          line="radixkv compare: interrupted")
    assert len(written) == 2 and all(n.startswith(".compare.") for n in written)  # json, png
    assert list(out_dir.iterdir()) == [] if existing else not out_dir.exists()


def test_ctrl_c_in_a_run(tmp_path, capsys, monkeypatch):
    def interrupt(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("radixkv.commands.simulate.run_config", interrupt)
    fails(capsys, "simulate", *SMALL, "--json", tmp_path / "s.json", status=130,
          line="radixkv simulate: interrupted")
    monkeypatch.setattr("radixkv.commands.replay.replay", interrupt)
    fails(capsys, "replay", "support", *SMALL, "--json", tmp_path / "r.json", status=130,
          line="radixkv replay: interrupted")
    assert list(tmp_path.iterdir()) == []


def test_absurd_pool_sizes_are_refused_before_anything_is_built(capsys, monkeypatch):
    with_memory(monkeypatch, 16)
    bookkeeping = "GiB of host memory for its slot bookkeeping; this machine has 16.0 GiB available"
    fails(capsys, "simulate", "--max-total-tokens", "1e11",
          line=f"radixkv simulate: error: a KV pool of 100,000,000,000 slots needs 838.2 "
               f"{bookkeeping}")
    # refused before the workload: --users 10**8 would be refused too, with another message
    fails(capsys, "simulate", "--max-total-tokens", "100000000000", "--users", "100000000",
          line=f"radixkv simulate: error: a KV pool of 100,000,000,000 slots needs 838.2 "
               f"{bookkeeping}")
    fails(capsys, "compare", "--max-total-tokens", "100000000000",
          line=f"radixkv compare: error: a KV pool of 100,000,000,000 slots needs 838.2 "
               f"{bookkeeping}")
    fails(capsys, "replay", "support", "--max-total-tokens", "1e30", "--cache", "radix",
          line=f"radixkv replay: error: a KV pool of {10**30:,} slots needs "
               f"{9 * 10**30 / 2**30:,.1f} {bookkeeping}")
    fails(capsys, "simulate", "--max-total-tokens", "1.5e0",
          line="radixkv simulate: error: --max-total-tokens: bad capacity '1.5e0': a token "
               "count must be a whole number")
    fails(capsys, "replay", "support", "--max-total-tokens", str(10**30), "--cache", "radix",
          line=f"radixkv replay: error: a KV pool of {10**30:,} slots needs "
               f"{9 * 10**30 / 2**30:,.1f} {bookkeeping}")


def test_absurd_generator_sizes(capsys):
    fails(capsys, "simulate", "--users", "100000000",
          line="radixkv simulate: error: support: num_users=100000000, turns=5, "
               "rag_fraction=0.2, system_len=512, fewshot_len=1543, rag_len=2112, "
               "msg_len=(40, 160), reply_len=(100, 400) would generate 2.2e+12 tokens, over the "
               "bound of 2,147,483,648 (2**31) tokens per workload")


def test_generate_checks_the_torch_kv_pool_against_memory(capsys, monkeypatch):
    with_memory(monkeypatch, 1)
    # tiny-llama in float32: 2 layers x 2 (K, V) x 2 heads x 64 dims x 4 bytes = 2,048 B/token
    fails(capsys, *GENERATE, "--workload", "support", "--max-total-tokens", "1000000",
          line="radixkv generate: error: --max-total-tokens 1,000,000: a KV pool of 1,000,000 "
               "tokens at 2,048 bytes per token (tiny-llama, float32) needs 1.9 GiB beside "
               "0.0 GiB of weights; this machine has 1.0 GiB available")


def test_the_kv_pool_check_counts_the_weights(capsys, monkeypatch):
    # 4 GiB of KV fits in 20 GiB alone; llama-3-8b's float32 weights (29.9 GiB) do not fit
    # beside it, and the check used to let the pool through to fail at allocation
    with_memory(monkeypatch, 20)
    fails(capsys, *GENERATE, "--model", "llama-3-8b", "--workload", "support",
          "--max-total-tokens", "16384",
          line="radixkv generate: error: --max-total-tokens 16,384: a KV pool of 16,384 tokens "
               "at 262,144 bytes per token (llama-3-8b, float32) needs 4.0 GiB beside 29.9 GiB "
               "of weights; this machine has 20.0 GiB available")


@pytest.mark.parametrize("argv, line", [
    (["--page-size", "0"], "--page-size must be a positive int, got 0"),
    (["--device", "tpu"], "device 'tpu' is not a torch device: cpu, cuda or cuda:N"),
    (["--device", "meta"], "device 'meta': models run on cpu or cuda"),
    (["--max-total-tokens", "8", "--page-size", "16"],
     "--max-total-tokens 8 is smaller than one page of 16 tokens"),
    (["--chunked-prefill-size", "-2"],
     "--chunked-prefill-size must be a positive int, or 0 or -1 for off, got -2"),
])
def test_generate_bad_options(argv, line, capsys):
    device = [] if "--device" in argv else ["--device", "cpu"]
    fails(capsys, "generate", "--workload", "support", *device, *argv,
          line=f"radixkv generate: error: {line}")


@pytest.mark.parametrize("spec, line", [
    ("b:dedup=maybe", "config key 'dedup' in 'b:dedup=maybe': bad value 'maybe': a bool is one "
                      "of 1/0/true/false/yes/no"),
    ("b:retract-insert=2", "config key 'retract-insert' in 'b:retract-insert=2': bad value '2': "
                           "a bool is one of 1/0/true/false/yes/no"),
    ("b:page-size=x", "config key 'page-size' in 'b:page-size=x': bad value 'x': expected an int"),
    ("b:colour=red", "unknown config key 'colour' in 'b:colour=red'; keys: cache, page-size, "
                     "block-size, radix-eviction-policy, slru-threshold, "
                     "prefix-caching-hash-algo, evict-granularity, retention-horizon, "
                     "max-pinned-tokens, host-kv-tokens, hicache-write-policy, schedule-policy, "
                     "max-prefill-tokens, "
                     "chunked-prefill-size, max-running-requests, disable-inbatch-dedup, "
                     "inbatch-dedup-check-threshold, inbatch-dedup-hold-threshold, "
                     "lpm-fallback-threshold, lpm-max-wait, disable-queue-aware-eviction, "
                     "retract-policy, retract-insert, "
                     "init-new-token-ratio, min-new-token-ratio, new-token-ratio-decay, "
                     "enable-mixed-chunk, shared-token-budget, seed"),
    ("b:cache=blockhash,page-size=4", "config 'b:cache=blockhash,page-size=4': --page-size "
                                      "applies to the radix and none caches, not to blockhash; "
                                      "blockhash takes --block-size"),
])
def test_compare_config_specs(spec, line, capsys):
    fails(capsys, "compare", *SMALL, "--config", spec, line=f"radixkv compare: error: {line}")


@pytest.mark.parametrize("argv, line", [
    (["--cache", "blockhash", "--page-size", "4"], "--page-size applies to the radix and none "
     "caches, not to blockhash; blockhash takes --block-size"),
    (["--cache", "radix", "--block-size", "4"], "--block-size applies to the blockhash cache, "
     "not to radix; radix and none take --page-size"),
    (["--disable-radix-cache", "--cache", "radix"], "--disable-radix-cache conflicts with --cache "
                                                    "radix"),
    (["--schedule-policy", "nope"], "--schedule-policy: unknown queue policy 'nope'; valid: fcfs, "
                                    "lpm, lof, random, priority, routing-key, dfs-weight"),
    (["--seed", "-1"], "--seed must be an int >= 0, got -1"),
    (["--trace-block-size", "64"], "--trace-block-size applies to hash-id traces, not to the "
                                   "generator 'support'"),
    (["--tokenizer", "t.json"], "--tokenizer applies to OpenAI chat logs, not to the generator "
                                "'support'"),
    (["--time-scale", "0"], "--time-scale must be a positive number, got 0.0"),
    (["--limit", "0"], "--limit must be a positive int, got 0"),
])
def test_simulate_bad_options(argv, line, capsys):
    out = fails(capsys, "simulate", *SMALL, *argv, line=f"radixkv simulate: error: {line}")
    assert out == ""


def test_flag_parse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        run(capsys, "simulate", "--limit", "many")
    assert e.value.code == 2
    assert capsys.readouterr().err == \
        "radixkv simulate: error: argument --limit: invalid int value: 'many'\n"


def test_generate_prompts_take_no_workload_options(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    fails(capsys, *GENERATE, "--prompts", prompts, "--time-scale", "2",
          line="radixkv generate: error: --time-scale applies to --workload, not to --prompts")
    fails(capsys, *GENERATE, "--prompts", prompts, "--users", "2",
          line="radixkv generate: error: --users applies to --workload, not to --prompts")


def test_files_that_are_not_utf8_are_named(tmp_path, capsys):
    trace = tmp_path / "latin1.jsonl"
    trace.write_bytes(b'{"id": "caf\xe9"}\n')
    fails(capsys, "replay", trace,
          line=f"radixkv replay: error: {trace}:1: not UTF-8 text: byte 0xe9 at column 12; "
               f"--skip-bad skips such lines")
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b"caf\xe9\n")
    fails(capsys, *GENERATE, "--prompts", prompts,
          line=f"radixkv generate: error: prompts file '{prompts}' is not UTF-8 text (byte 3)")


def test_wrong_trace_options(tmp_path, capsys):
    trace = hash_id_trace(tmp_path / "h64.jsonl")
    fails(capsys, "replay", trace, "--rate", "2",
          line=f"radixkv replay: error: --rate applies to generators, not to '{trace}' (a "
               f"hash-id trace)")
    fails(capsys, "replay", trace, "--seed", "2",
          line=f"radixkv replay: error: --seed applies to generators, not to '{trace}' (a "
               f"hash-id trace)")
    fails(capsys, "replay", trace,
          line=f"radixkv replay: error: {trace}:1: len(hash_ids) = 3 but input_length 130 needs "
               f"ceil(130/512) = 1 blocks; --skip-bad skips such lines")
    fails(capsys, "replay", tmp_path / "nope.jsonl",
          line=f"radixkv replay: error: '{tmp_path / 'nope.jsonl'}' is neither a generator "
               f"(support, fewshot, multiturn, burst, tree, rag) nor an existing trace file")
