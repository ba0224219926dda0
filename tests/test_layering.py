"""Layering: each layer imports only from the layers below it.

    cache/      nothing above it (no sched, engine, model, sim, server, router, workloads,
                commands, cli, config, ...), and never torch: it runs on any CPU
    sched/      nothing from engine, model, sim, server, router, commands, cli
    engine/     the loop, the executor protocol and metrics: never model/ or sim/ (it does not
                know which executor runs)
    model/      the real model and its executor: never sim/
    sim/        the simulated GPU: never model/, and never torch (the named model shapes both
                use live in shapes.py, a leaf)
    workloads/  nothing from sched, engine, model or sim
    events      the KV-event wire format and index: the cache's events only
    server/     the HTTP server: anything below it, never the commands or the cli
    router/     routing policies and the cluster simulator: the engine and the simulated GPU, never
                torch, the server, the commands or the cli
    calibration, fidelity: the real executor timed and compared with the simulator; never the
                server, the routers or the commands
    ray_router  the Ray Serve RequestRouter: the routers inside a server deployment, never the
                commands or the cli
    bench_serve, bench_stats, serve_process: the HTTP load client, which speaks to any
                OpenAI-compatible server: never the engine or the server's code
    shapes, validate, registry: leaves (validate and registry are used by every layer)

Every import statement counts, including lazy ones inside functions and TYPE_CHECKING blocks.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "radixkv"

_TOP = {"server", "router", "commands", "cli", "simulate", "replay", "plot", "__main__"}
FORBIDDEN = {
    "cache": {"sched", "engine", "model", "sim", "workloads", "config"} | _TOP,
    "sched": {"engine", "model", "sim"} | _TOP,
    "engine": {"model", "sim"} | _TOP,
    "model": {"sim"} | _TOP,
    "sim": {"model"} | _TOP,
    "workloads": {"sched", "engine", "model", "sim"} | _TOP,
    "events": {"sched", "engine", "model", "sim", "workloads", "config"} | _TOP,
    "server": {"commands", "cli", "router", "__main__", "plot", "simulate", "replay"},
    "router": {"model", "server", "commands", "cli", "__main__", "ray_router"},
    **{tool: {"server", "router", "commands", "cli", "__main__"}
       for tool in ("calibration", "fidelity")},
    "ray_router": {"commands", "cli", "__main__", "plot", "simulate", "replay"},
    **{client: {"cache", "sched", "engine", "model", "sim", "server", "router", "commands",
                "cli", "__main__"} for client in ("bench_serve", "bench_stats", "serve_process")},
    "shapes": {"cache", "sched", "engine", "model", "sim", "workloads", "config"} | _TOP,
    "validate": {"cache", "sched", "engine", "model", "sim", "workloads", "config", "shapes",
                 "registry"} | _TOP,
    "registry": {"cache", "sched", "engine", "model", "sim", "workloads", "config", "shapes"} | _TOP,
}
NO_TORCH = {"cache", "sim", "events", "router"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`; relative imports resolved
    against `module` (a package's own name when is_package)."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((node.lineno, target))
            # `from radixkv import sched` imports the subpackage
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def layer_files(layer: str) -> list[Path]:
    files = sorted((PKG / layer).rglob("*.py")) if (PKG / layer).is_dir() else [PKG / f"{layer}.py"]
    assert files, f"no modules under radixkv/{layer}"
    return files


def violations(layer: str) -> list[str]:
    bad = []
    for path in layer_files(layer):
        mod = module_name(path)
        for line, target in imports_of(path.read_text(), mod, path.name == "__init__.py"):
            parts = target.split(".")
            if parts[0] == "radixkv" and len(parts) > 1 and parts[1] in FORBIDDEN[layer]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            if layer in NO_TORCH and parts[0] == "torch":
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    assert violations(layer) == []


def test_import_resolver_sees_every_form():
    src = ("import radixkv.engine.engine\n"
           "from radixkv import sched\n"
           "from ..engine import executor\n"
           "from . import key\n"
           "def f():\n    import torch\n"
           "if False:\n    from radixkv.config import CacheConfig\n")
    got = {t for _, t in imports_of(src, "radixkv.cache.radix", is_package=False)}
    assert {"radixkv.engine.engine", "radixkv.sched", "radixkv.engine",
            "radixkv.engine.executor", "radixkv.cache.key", "torch",
            "radixkv.config"} <= got
    init = {t for _, t in imports_of("from .chat import x\n", "radixkv.workloads", True)}
    assert "radixkv.workloads.chat" in init


def test_cache_and_scheduler_import_without_torch():
    code = ("import sys\n"
            "import radixkv.cache, radixkv.sched.scheduler\n"
            "import radixkv.cache.radix, radixkv.cache.blockhash, radixkv.cache.nocache\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import radixkv.engine.engine, radixkv.sim.executor, radixkv.simulate\n"
            "assert 'torch' not in sys.modules, 'the simulator imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


# ---- no type switches on caches: what the scheduler needs is part of the contract ----------
CONCRETE = {"RadixCache", "BlockHashCache", "NoCache", "TreeNode", "Block"}


def type_switches(path: Path) -> list[str]:
    """isinstance/issubclass checks against a concrete cache or node class, and getattr or
    hasattr probes of an attribute by name with a fallback (capability sniffing)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        fn, where = node.func.id, f"{path.relative_to(ROOT)}:{node.lineno}"
        if fn in ("isinstance", "issubclass") and len(node.args) == 2:
            t = node.args[1]
            names = {e.id if isinstance(e, ast.Name) else getattr(e, "attr", "")
                     for e in (t.elts if isinstance(t, ast.Tuple) else [t])}
            bad += [f"{where} {fn}(..., {n})" for n in sorted(names & CONCRETE)]
        if (fn == "getattr" and len(node.args) == 3) or fn == "hasattr":
            attr = node.args[1]
            if isinstance(attr, ast.Constant):
                bad.append(f"{where} {fn}(..., {attr.value!r})")
    return bad


def test_no_concrete_cache_type_switches_outside_cache():
    files = [p for p in sorted(PKG.rglob("*.py")) if "cache" not in p.relative_to(PKG).parts[:1]]
    assert len(files) > 20
    assert [b for p in files for b in type_switches(p)] == []


def test_type_switch_finder_sees_each_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("isinstance(c, RadixCache)\nisinstance(n, (int, cache.TreeNode))\n"
                   "getattr(c, 'epoch', 0)\nhasattr(e, 'release')\nisinstance(x, int)\n")
    src = src.rename(ROOT / "tests" / "_switch_probe.py")
    try:
        found = type_switches(src)
    finally:
        src.unlink()
    assert [f.split(" ", 1)[1] for f in found] == [
        "isinstance(..., RadixCache)", "isinstance(..., TreeNode)", "getattr(..., 'epoch')",
        "hasattr(..., 'release')"]
