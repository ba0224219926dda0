"""The house: every module in a room named for what it holds, each room importing only the rooms
below it, no import circle, no module past ~450 lines.

The package root keeps the entry point and the leaves every layer uses (ROOT_MODULES); every
other module lives in a room (a subpackage whose `__init__` docstring says what it holds).
ROOMS names every room and root module and what it may import (other rooms and root modules;
the package itself, which holds only `__version__`, is open to all). Read bottom-up:

    argcheck, env       leaves: the argument checks, the environment
    registry, shapes    name -> object registries; the named model shapes
    tokenizer           leaf: the byte tokenizer and tokenizer.json files (no torch)
    promtext            leaf: Prometheus text parsed (the load client and the gateway)
    cache/              prefix caches, slot pool, eviction orders, the request lifecycle; no torch
    sched/              requests, queue orders, admission, the scheduler; never the engine
    config              the engine's configuration, composing the cache's and the scheduler's
    workloads/          generators and trace readers
    engine/             the loop and the executor protocol: never model/ or sim/
    model/, sim/        the real model (torch) and the simulated GPU (no torch), never each other
    kvevents/           KV events in vLLM's format: wire, publisher, subscriber index
    router/             the routing policies: never torch, the server or the offline wing
    server/             the HTTP server; never a router, the commands or the cli
    rayserve/           the server's replicas on Ray Serve, the routers as its RequestRouter
    gateway/            `radixkv route`: the routers in front of any OpenAI-compatible fleet
    bench/              the HTTP load client and experiments on running servers: speaks HTTP,
                        never the engine or the server's code
    offline/            the offline wing, nothing serving imports it: replay and simulation of a
                        workload without a server, and below it, each a room of its own:
      offline/cluster/      the cluster simulator over the routers
      offline/planning/     capacity curves, and the deployment search over cluster simulations
      offline/calibration/  the real executor timed and compared with the simulator
      offline/plots/        pictures
    commands/, cli      the command line, over everything

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

ROOT_MODULES = {"cli", "config", "argcheck", "registry", "env", "shapes", "promtext",
                "tokenizer"}
_CORE = {"argcheck", "registry"}
# the offline wing's rooms, each a subpackage of radixkv/offline/
WING = "offline"
WING_ROOMS = {"cluster", "planning", "calibration", "plots"}
ROOMS: dict[str, set[str]] = {
    "argcheck": set(),
    "env": set(),
    "promtext": set(),
    "tokenizer": set(),
    "registry": {"argcheck"},
    "shapes": {"argcheck"},
    "cache": _CORE,
    "sched": {"cache"} | _CORE,
    "config": {"cache", "sched"} | _CORE,
    "workloads": {"tokenizer"} | _CORE,
    "engine": {"cache", "sched", "config", "workloads"} | _CORE,
    "model": {"engine", "sched", "cache", "config", "shapes", "env", "tokenizer"} | _CORE,
    "sim": {"engine", "sched", "cache", "config", "shapes", "env"} | _CORE,   # env: the tables' cache
    "kvevents": {"cache"} | _CORE,
    "router": {"engine", "sched", "cache", "config", "sim", "kvevents", "workloads"} | _CORE,
    "server": {"engine", "sched", "cache", "config", "model", "sim", "kvevents", "workloads",
               "shapes", "env", "tokenizer"} | _CORE,
    "rayserve": {"server", "router", "kvevents", "engine", "sched", "cache", "config", "sim",
                 "shapes"} | _CORE,
    "gateway": {"router", "kvevents", "model", "server", "sim", "cache", "sched", "engine",
                "config", "shapes", "promtext", "tokenizer"} | _CORE,
    "bench": {"workloads", "shapes", "promtext"} | _CORE,
    "offline": {"engine", "sched", "cache", "config", "sim", "workloads"} | _CORE,
    "offline.cluster": {"offline", "engine", "sched", "cache", "config", "sim", "workloads",
                        "router"} | _CORE,
    "offline.planning": {"offline", "offline.cluster", "engine", "sched", "cache", "config",
                         "sim", "workloads", "router"} | _CORE,
    "offline.calibration": {"model", "sim", "engine", "sched", "cache", "config", "workloads",
                            "shapes"} | _CORE,
    "offline.plots": {"engine", "offline.planning", "offline.cluster"} | _CORE,
    "commands": {"bench", "cache", "offline.calibration", "config", "engine", "kvevents", "model",
                 "offline", "offline.planning", "offline.plots", "offline.cluster", "rayserve",
                 "router", "sched", "server", "gateway", "shapes", "sim", "workloads",
                 "env", "tokenizer"} | _CORE,
    "cli": {"commands"},
}
# torch only where the real model runs (env imports it lazily to tell whether CUDA is there)
TORCH = {"model", "offline.calibration", "env"}
MAX_LINES = 450


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
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


def modules(pkg: Path) -> dict[str, Path]:
    """Every module of the package at `pkg`, by its dotted name."""
    return {module_name(p, pkg.parent): p for p in sorted(pkg.rglob("*.py"))}


def unit_of(module: str) -> str:
    """The room or root module a module belongs to ("" for the package itself); a module of
    one of the offline wing's rooms belongs to "offline.ROOM"."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == WING and parts[2] in WING_ROOMS:
        return f"{WING}.{parts[2]}"
    if len(parts) == 3 and parts[1] == WING and parts[2] in WING_ROOMS:
        return f"{WING}.{parts[2]}"     # the room's own __init__
    return parts[1] if len(parts) > 1 else ""


def loose_modules(pkg: Path) -> set[str]:
    """Modules at the package root, beside __init__ and __main__."""
    return {p.stem for p in pkg.glob("*.py")} - {"__init__", "__main__"}


def rooms_on_disk(pkg: Path) -> set[str]:
    """Every subpackage holding code; the offline wing's rooms as "offline.ROOM"."""
    top = {d.name for d in pkg.iterdir() if d.is_dir() and any(d.rglob("*.py"))}
    wing = pkg / WING
    inner = {f"{WING}.{d.name}" for d in wing.iterdir()
             if d.is_dir() and any(d.rglob("*.py"))} if wing.is_dir() else set()
    return top | inner


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (any import statement, anywhere)."""
    mods = modules(pkg)
    return {m: {t for _, t in imports_of(p.read_text(), m, p.name == "__init__.py")
                if t in mods and t != m}
            for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each
    sorted; a node importing itself counts too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    out.append(sorted(comp))
    return out


def violations(unit: str) -> list[str]:
    bad = []
    for mod, path in modules(PKG).items():
        if unit_of(mod) != unit:
            continue
        for line, target in imports_of(path.read_text(), mod, path.name == "__init__.py"):
            parts = target.split(".")
            where = f"{path.relative_to(ROOT)}:{line}"
            to = unit_of(target)
            if parts[0] == "radixkv" and to not in ("", unit, "__version__") \
                    and to not in ROOMS[unit]:
                bad.append(f"{where} imports {target}")
            if unit not in TORCH and parts[0] == "torch":
                bad.append(f"{where} imports {target}")
    return bad


# ---- the house ----------------------------------------------------------------------------
def test_root_holds_only_the_leaves():
    assert len(ROOT_MODULES) <= 8
    loose = loose_modules(PKG)
    assert sorted(loose - ROOT_MODULES) == [], "modules outside any room"
    assert sorted(ROOT_MODULES - loose) == [], "root modules listed but missing"


def test_every_room_is_named_and_says_what_it_holds():
    rooms = rooms_on_disk(PKG)
    assert rooms == set(ROOMS) - ROOT_MODULES
    for room in sorted(rooms):
        init = PKG.joinpath(*room.split(".")) / "__init__.py"
        assert init.is_file(), f"radixkv/{room} has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 8, f"radixkv/{room}/__init__.py says not what it holds"


@pytest.mark.parametrize("unit", sorted(ROOMS))
def test_room_imports_only_the_rooms_below_it(unit):
    assert violations(unit) == []


def test_rooms_form_no_circle():
    assert all(deps <= set(ROOMS) for deps in ROOMS.values())
    assert circles(ROOMS) == []


def test_no_import_circle():
    assert circles(import_graph(PKG)) == []


def test_no_module_past_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# ---- the checks see what they must --------------------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "radixkv"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_a_planted_circle_is_found(tmp_path):
    pkg = _package(tmp_path, {
        "cache/__init__.py": '"""c"""\n',
        "cache/a.py": "from radixkv.cache import b\n",
        "cache/b.py": "def f():\n    from radixkv.cache.c import x\n",
        "cache/c.py": "from . import a\n",
        "cache/d.py": "import radixkv.cache.a\n",
        "sched/__init__.py": "from radixkv.cache import d\n"})
    assert circles(import_graph(pkg)) == [["radixkv.cache.a", "radixkv.cache.b",
                                           "radixkv.cache.c"]]
    assert circles({"x": {"y"}, "y": {"z"}, "z": set()}) == []
    assert circles({"x": {"x"}}) == [["x"]]


def test_a_planted_loose_module_is_found(tmp_path):
    pkg = _package(tmp_path, {"__main__.py": "", "cli.py": "", "helpers.py": "",
                              "cache/__init__.py": "", "cache/radix.py": ""})
    assert loose_modules(pkg) == {"cli", "helpers"}
    assert rooms_on_disk(pkg) == {"cache"}


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
            "import radixkv.engine.engine, radixkv.sim.executor, radixkv.offline.simulate\n"
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
