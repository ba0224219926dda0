"""Results of a fixed set of runs, for checking that a speed change changed none of them.

Runs `radixkv compare`, `radixkv replay` (radix and blockhash, unlimited and bounded) and
`radixkv cluster` (every compared router, Mooncake synthetic when present) and writes each
JSON with its run-time fields (wall seconds, CPU per request) removed, then one SHA-256 per
file. `--against DIR` compares with the files of an earlier run, byte for byte.

    python benchmarks/same_results.py --out DIR [--against DIR] [--quick]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared/traces/mooncake/synthetic_trace.jsonl"
VOLATILE = {"wall_s", "cpu_us_per_request"}
ROUTERS = ["round-robin", "power-of-two", "least-load", "session-hash", "ray-prefix-affinity",
           "sglang-cache-aware", "llm-d-precise", "radixkv", "radixkv-fit"]


def jobs(quick: bool) -> dict[str, list[str]]:
    out = {
        "compare-support": ["compare", "support"],
        "compare-multiturn-lpm": ["compare", "multiturn", "--schedule-policy", "lpm"],
        "replay-support": ["replay", "support", "--cache", "radix", "blockhash"],
        "replay-support-50k": ["replay", "support", "--cache", "radix", "blockhash",
                               "--max-total-tokens", "50000"],
        "cluster-support": ["cluster", "support", "--replicas", "4", "--router", *ROUTERS],
    }
    if TRACE.is_file() and not quick:
        out |= {
            "replay-mooncake": ["replay", str(TRACE), "--cache", "radix", "blockhash"],
            "replay-mooncake-3m": ["replay", str(TRACE), "--cache", "radix", "blockhash",
                                   "--max-total-tokens", "3000000"],
            "cluster-mooncake-8": ["cluster", str(TRACE), "--replicas", "8", "--router",
                                   *ROUTERS],
        }
    return out


def scrub(x):
    if isinstance(x, dict):
        return {k: scrub(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [scrub(v) for v in x]
    return x


def run(name: str, argv: list[str], out: Path) -> Path:
    tmp = out / f"{name}.raw"
    if argv[0] == "compare":
        cmd = [*argv, "--out", str(tmp)]
        src = tmp / "compare.json"
    else:
        cmd = [*argv, "--json", str(tmp)]
        src = tmp
    subprocess.run([sys.executable, "-m", "radixkv", *cmd], check=True,
                   stdout=subprocess.DEVNULL, cwd=out)
    dst = out / f"{name}.json"
    dst.write_text(json.dumps(scrub(json.loads(src.read_text())), indent=1, sort_keys=True))
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--against", type=Path, help="a folder of an earlier run to compare with")
    ap.add_argument("--quick", action="store_true", help="the generated workloads only")
    ap.add_argument("--only", nargs="+", help="these jobs only")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for name, argv in jobs(a.quick).items():
        if a.only and name not in a.only:
            continue
        path = run(name, argv, a.out.resolve())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        verdict = ""
        if a.against is not None:
            old = a.against / path.name
            same = old.is_file() and old.read_bytes() == path.read_bytes()
            differ += not same
            verdict = "identical" if same else "DIFFERENT"
        print(f"{name:<24} {digest} {verdict}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
