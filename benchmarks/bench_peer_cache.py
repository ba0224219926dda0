"""Peer benchmark: radixkv's radix tree and block-hash cache beside the compiled peers, same run.

Tree rows: SGLang 0.5.23's Rust-backed tree (`sglang_tree_bench.py --tree unified-rust`) and
radixkv's RadixCache (`radixkv_tree_bench.py`) on the support replay, µs per request for
match_prefix and insert, at unlimited capacity and at 200,000 tokens (goal: ratio ≤ 0.7).
Block-hashing rows: vLLM 0.33's KVCacheManager (`vllm_apc_bench.py`, per request = hash_prompt +
lookup + hash_output + allocate + free) and `radixkv replay --cache blockhash`
(cpu_us_per_request), unlimited and at 50,000 tokens (goal: ratio ≤ 0.4, equal hit tokens),
then radixkv's blockhash replay with KV events on against off (goal: ≤ 1.5).

The workload comes from `../shared/peers/gen_workload.py` (relative to the repository root),
written to a temporary folder. Peers run in their own venvs (`.peers/sglang`, `.peers/vllm`);
a row whose venv or harness is absent is skipped with the reason. The machine may be shared:
peer and radixkv runs alternate, `--repeat` times, and each figure is the median.

    python benchmarks/bench_peer_cache.py [--repeat 3] [--skip-tree] [--skip-blockhash]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT.parent / "shared" / "peers"
SGLANG_PY = ROOT / ".peers" / "sglang" / "bin" / "python"
VLLM_PY = ROOT / ".peers" / "vllm" / "bin" / "python"
TREE_GOAL, HASH_GOAL, EVENTS_GOAL = 0.7, 0.4, 1.5
VLLM_TIMERS = ("hash_prompt", "lookup", "hash_output", "allocate", "free")


def _json_out(cmd: list[str]) -> dict:
    """Run a harness and read the JSON report it prints last (a multi-line object or one line)."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    start = out.rfind("\n{") + 1 if not out.lstrip().startswith("{") else out.index("{")
    return json.loads(out[start:])


def _missing(*paths: Path) -> str | None:
    gone = [str(p) for p in paths if not p.exists()]
    return f"not found: {', '.join(gone)}" if gone else None


def make_workload(tmp: Path) -> tuple[Path, Path]:
    """The peers' JSONL workload, and the same requests as radixkv JSONL (arrival 0, file order)."""
    peer = tmp / "wl.jsonl"
    subprocess.run([sys.executable, str(PEERS / "gen_workload.py"), "--out", str(peer)],
                   check=True, capture_output=True)
    ours = tmp / "wl_radixkv.jsonl"
    with open(peer) as src, open(ours, "w") as dst:
        for line in src:
            if line.strip():
                dst.write(json.dumps(json.loads(line) | {"arrival": 0.0}) + "\n")
    return peer, ours


def tree_rows(wl: Path, repeat: int) -> list[tuple]:
    """(capacity, op, sglang µs, radixkv µs) per capacity and op, medians of alternating runs."""
    rows = []
    for cap in (0, 200_000):
        peer = {"match": [], "insert": []}
        ours = {"match": [], "insert": []}
        for _ in range(repeat):
            s = _json_out([str(SGLANG_PY), str(PEERS / "sglang_tree_bench.py"), "--tree",
                           "unified-rust", "--workload", str(wl), "--capacity", str(cap)])
            r = _json_out([sys.executable, str(PEERS / "radixkv_tree_bench.py"), "--workload",
                           str(wl), "--capacity", str(cap)])
            for op, name in (("match", "match_prefix"), ("insert", "insert")):
                peer[op].append(s["timing"][name]["cpu_mean_us"])
                ours[op].append(r[name]["cpu_mean_us"])
        for op in ("match", "insert"):
            rows.append((cap, op, statistics.median(peer[op]), statistics.median(ours[op])))
    return rows


def _vllm(wl: Path, cap: int | None) -> tuple[float, int]:
    cmd = [str(VLLM_PY), str(PEERS / "vllm_apc_bench.py"), "--workload", str(wl), "--capacity",
           "inf" if cap is None else str(cap), "--disable-gc"]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(cmd + ["--out", f"{d}/v.json"], check=True, capture_output=True)
        rep = json.loads(Path(f"{d}/v.json").read_text())
    t = rep["timing"]
    return sum(t[k]["total_s"] for k in VLLM_TIMERS) * 1e6 / rep["requests"], rep["hit_tokens"]


def _radixkv_replay(wl: Path, cap: int | None) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "radixkv", "replay", str(wl), "--cache", "blockhash"]
    cmd += [] if cap is None else ["--max-total-tokens", str(cap)]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(cmd + ["--json", f"{d}/r.json"], check=True, capture_output=True, cwd=d)
        res = json.loads(Path(f"{d}/r.json").read_text())["results"][0]
    return res["cpu_us_per_request"], res["hit_tokens"]


def blockhash_rows(peer_wl: Path, our_wl: Path, repeat: int) -> list[tuple]:
    """(capacity, vLLM µs, radixkv µs, vLLM hits, radixkv hits), medians of alternating runs."""
    rows = []
    for cap in (None, 50_000):
        v, r = [], []
        for _ in range(repeat):
            v.append(_vllm(peer_wl, cap))
            r.append(_radixkv_replay(our_wl, cap))
        rows.append((cap, statistics.median(x for x, _ in v), statistics.median(x for x, _ in r),
                     v[0][1], r[0][1]))
    return rows


def events_rows(our_wl: Path, repeat: int) -> list[tuple]:
    """(capacity, events off µs, events on µs, hits equal) of radixkv's blockhash replay."""
    from radixkv.config import CacheConfig
    from radixkv.offline.replay import collect_simulation, replay
    from radixkv.workloads import load_workload

    def run(events: bool, cap: int | None):
        collect_simulation()        # the last run's cycles, freed outside the timer
        return replay(w, CacheConfig("blockhash", 16, "lru", enable_events=events).build(), cap)

    w = load_workload(our_wl)
    rows = []
    for cap in (None, 50_000):
        off, on = [], []
        for _ in range(repeat):
            off.append(run(False, cap))
            on.append(run(True, cap))
        rows.append((cap, statistics.median(s.cpu_us_per_request for s in off),
                     statistics.median(s.cpu_us_per_request for s in on),
                     all(s.hits == off[0].hits for s in off + on)))
    return rows


def _cap(cap: int | None) -> str:
    return "unlimited" if not cap else f"{cap:,}"


def _met(ratio: float, goal: float) -> str:
    return f"≤ {goal:g} " + ("✓" if ratio <= goal else "✗")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs per row; the median counts")
    ap.add_argument("--skip-tree", action="store_true")
    ap.add_argument("--skip-blockhash", action="store_true")
    args = ap.parse_args()
    con = Console(width=max(Console().width, 120))
    gone = _missing(PEERS / "gen_workload.py")
    if gone:
        con.print(f"every row skipped: the peers' harnesses are absent ({gone})")
        return 0
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        peer_wl, our_wl = make_workload(Path(tmp))
        con.print(f"workload: {sum(1 for _ in open(peer_wl)):,} requests from gen_workload.py; "
                  f"median of {args.repeat} alternating runs")
        t = Table(title="radix tree: µs per request on the support replay (page 1, LRU)")
        for c in ("capacity", "op", "SGLang Rust µs", "radixkv µs", "ratio", "goal"):
            t.add_column(c, justify="right")
        gone = _missing(SGLANG_PY, PEERS / "sglang_tree_bench.py", PEERS / "radixkv_tree_bench.py")
        if args.skip_tree:
            con.print("tree rows skipped (--skip-tree)")
        elif gone:
            con.print(f"tree rows skipped: {gone}")
        else:
            for cap, op, s, r in tree_rows(peer_wl, args.repeat):
                ok &= r / s <= TREE_GOAL
                t.add_row(_cap(cap), op, f"{s:.1f}", f"{r:.1f}", f"{r / s:.2f}", _met(r / s, TREE_GOAL))
            con.print(t)
        gone = _missing(VLLM_PY, PEERS / "vllm_apc_bench.py")
        if args.skip_blockhash:
            con.print("block-hashing rows skipped (--skip-blockhash)")
            return 0 if ok else 1
        if gone:
            con.print(f"vLLM rows skipped: {gone}")
        else:
            t = Table(title="block hashing: µs per request (vLLM: hash_prompt + lookup + hash_output "
                            "+ allocate + free; radixkv: replay cpu_us_per_request)")
            for c in ("capacity", "vLLM µs", "radixkv µs", "ratio", "goal", "vLLM hits",
                      "radixkv hits"):
                t.add_column(c, justify="right")
            for cap, v, r, vh, rh in blockhash_rows(peer_wl, our_wl, args.repeat):
                ok &= r / v <= HASH_GOAL
                t.add_row(_cap(cap), f"{v:.0f}", f"{r:.0f}", f"{r / v:.2f}", _met(r / v, HASH_GOAL),
                          f"{vh:,}", f"{rh:,}" + ("" if vh == rh else " ≠"))
            con.print(t)
        t = Table(title="radixkv blockhash replay: KV events on against off")
        for c in ("capacity", "events off µs", "events on µs", "ratio", "goal", "same hits"):
            t.add_column(c, justify="right")
        for cap, off, on, same in events_rows(our_wl, args.repeat):
            ok &= on / off <= EVENTS_GOAL and same
            t.add_row(_cap(cap), f"{off:.0f}", f"{on:.0f}", f"{on / off:.2f}",
                      _met(on / off, EVENTS_GOAL), "yes" if same else "NO")
        con.print(t)
    con.print("all goals met" if ok else "[red]some goals missed[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
