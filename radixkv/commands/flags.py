"""The configuration flags of every subcommand, generated from the field metadata of the config
dataclasses (radixkv/config.py), and the one way back from parsed flags to configs.

A flag left out parses as None and the field's own default applies, so a config is built the
same way whichever subcommand parsed it, and a flag that was given can be told from one that
was not (a flag for a cache none of the chosen caches uses is refused, not ignored).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Iterable, Literal

from radixkv.cache.pool import SlotPool
from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.presets import EngineDefaults
from radixkv.argcheck import parse_capacity

BLOCK_SIZE = 16                     # vLLM's default block
CACHE_KINDS = ("radix", "blockhash", "none")
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True)
class ConfigFlag:
    """One field's flag, read from its metadata."""
    owner: type
    name: str
    flag: str
    aliases: tuple[str, ...]
    help: str
    default: Any
    negate: bool = False             # the flag turns a bool field off
    off: int | None = None           # a command-line value that means 0 (off), as SGLang's -1
    choices: str | None = None       # "module:NAME" of the registry of valid values
    metavar: str | None = None       # set: the value is text, parsed later (a capacity)
    caches: tuple[str, ...] = CACHE_KINDS    # the caches a cache option applies to

    def valid(self) -> list[str]:
        module, _, name = (self.choices or "").partition(":")
        return list(getattr(import_module(module), name)) if module else []

    def shown_default(self) -> str:
        if isinstance(self.default, bool):
            return "off" if self.default == self.negate else "on"
        return str(self.default)


def config_flags(cls: type) -> dict[str, ConfigFlag]:
    """field name -> its flag, for the fields of `cls` whose metadata names one."""
    out = {}
    for f in dataclasses.fields(cls):
        m = f.metadata
        if "flag" in m:
            out[f.name] = ConfigFlag(cls, f.name, m["flag"], tuple(m.get("aliases", ())),
                                     m["help"], f.default, m.get("negate", False), m.get("off"),
                                     m.get("choices"), m.get("metavar"),
                                     tuple(m.get("caches", CACHE_KINDS)))
    return out


CACHE_FLAGS = config_flags(CacheConfig)
SCHED_FLAGS = config_flags(SchedulerConfig)
ENGINE_FLAGS = config_flags(EngineConfig)
_CACHE_OPTIONS = [n for n in CACHE_FLAGS if n != "kind"]


def parse_bool(text: str, what: str) -> bool:
    value = _BOOLS.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{what}: bad value {text!r}: a bool is one of 1/0/true/false/yes/no")
    return value


def _add(group: Any, cf: ConfigFlag, *, help: str | None = None, default: str | None = None,
         **kw: Any) -> None:
    """The flag, shown with its default and valid values, and its old spellings, hidden."""
    text = help or cf.help
    valid = cf.valid()
    if valid:
        text += f": {', '.join(valid)}"
    text += f" (default: {default or cf.shown_default()})"
    if isinstance(cf.default, bool):
        kw = {"action": "store_const", "const": not cf.negate, **kw}
    elif cf.metavar:
        kw = {"metavar": cf.metavar, **kw}
    else:
        kw = {"type": type(cf.default), "metavar": _metavar(cf), **kw}
    group.add_argument(cf.flag, dest=cf.name, default=None, help=text, **kw)
    for alias in cf.aliases:
        group.add_argument(alias, dest=cf.name, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS, **kw)


def _metavar(cf: ConfigFlag) -> str:
    return "NAME" if cf.choices else {int: "N", float: "X"}.get(type(cf.default), "VALUE")


def add_config_flags(p: argparse.ArgumentParser, *, caches: Literal["one", "many"] | None,
                     scheduler: bool, max_total_tokens: str) -> None:
    """The cache flags (`caches`: one cache, several side by side, or none of these flags),
    the scheduler's (when `scheduler`), the KV pool (`max_total_tokens`: the default shown)
    and --seed; the same names, help and defaults in every subcommand."""
    p.set_defaults(cache_mode=caches)
    if caches:
        g = p.add_argument_group("prefix cache")
        kind = CACHE_FLAGS["kind"]
        if caches == "many":
            _add(g, kind, help="prefix caches to compare, side by side", nargs="+",
                 default=" ".join(CACHE_KINDS))
        else:
            _add(g, kind)
        g.add_argument("--disable-radix-cache", action="store_true",
                       help="no prefix cache: the same as --cache none")
        for name in _CACHE_OPTIONS:
            _add(g, CACHE_FLAGS[name])
            if name == "page_size":
                g.add_argument("--block-size", type=int, metavar="N",
                               help=f"tokens per block of the blockhash cache (default: "
                                    f"{BLOCK_SIZE})")
    if scheduler:
        g = p.add_argument_group("scheduler")
        for name, cf in SCHED_FLAGS.items():
            if name != "seed":
                _add(g, cf)
    g = p.add_argument_group("memory and checks")
    _add(g, ENGINE_FLAGS["kv_capacity"], default=max_total_tokens,
         help=ENGINE_FLAGS["kv_capacity"].help if caches != "many" else
         "KV pool: tokens, or a byte size such as 40GiB (with --kv-bytes-per-token or --model)")
    _add(g, ENGINE_FLAGS["check_invariants"])
    cf = SCHED_FLAGS["seed"]
    _add(g, cf, help=cf.help if scheduler else "seed of the workload generator")


def _build(cls: type, kw: dict[str, Any], flags: dict[str, str]) -> Any:
    """cls(**kw); its ValueError speaks of flags instead of fields."""
    try:
        return cls(**kw)
    except ValueError as e:
        msg = str(e)
        for name, flag in flags.items():
            msg = msg.replace(f"{cls.__name__}.{name}", flag)
        raise ValueError(msg) from None


def _from_cli(cf: ConfigFlag, value: Any) -> Any:
    if cf.off is None or not isinstance(value, int) or value > 0:
        return value
    if value not in (0, cf.off):
        raise ValueError(f"{cf.flag} must be a positive int, or 0 or {cf.off} for off, "
                         f"got {value}")
    return 0


def cache_config(kind: str, given: dict[str, Any], block_size: int | None = None) -> CacheConfig:
    """The cache `kind` with the options in `given` that apply to it (page_size for radix and
    none, block_size for blockhash, eviction and slru_threshold for radix, ...)."""
    kw = {k: v for k, v in given.items() if kind in CACHE_FLAGS[k].caches}
    flags = {n: cf.flag for n, cf in CACHE_FLAGS.items()}
    if kind == "blockhash":
        kw["page_size"] = BLOCK_SIZE if block_size is None else block_size
        flags["page_size"] = "--block-size"
    return _build(CacheConfig, {"kind": kind, **kw}, flags)


def _check_used(kinds: Iterable[str], given: dict[str, Any], block_size: int | None) -> None:
    kinds = list(kinds)
    if block_size is not None and "blockhash" not in kinds:
        raise ValueError(f"--block-size applies to the blockhash cache, not to "
                         f"{' or '.join(kinds)}; radix and none take --page-size")
    for name in given:
        users = CACHE_FLAGS[name].caches
        if not set(users) & set(kinds):
            hint = "; blockhash takes --block-size" if name == "page_size" else ""
            raise ValueError(f"{CACHE_FLAGS[name].flag} applies to the {' and '.join(users)} "
                             f"cache{'s' if len(users) > 1 else ''}, not to "
                             f"{' or '.join(kinds)}{hint}")


def cache_configs(args: argparse.Namespace) -> tuple[CacheConfig, ...]:
    kinds = args.kind
    if isinstance(kinds, str):
        kinds = [kinds]
    if args.disable_radix_cache:
        if kinds and kinds != ["none"]:
            raise ValueError(f"--disable-radix-cache conflicts with --cache {' '.join(kinds)}")
        kinds = ["none"]
    if not kinds:
        kinds = list(CACHE_KINDS) if args.cache_mode == "many" else [CACHE_FLAGS["kind"].default]
    for k in kinds:
        _build(CacheConfig, {"kind": k}, {"kind": "--cache"})
    given = {n: getattr(args, n) for n in _CACHE_OPTIONS if getattr(args, n) is not None}
    _check_used(kinds, given, args.block_size)
    return tuple(cache_config(k, given, args.block_size) for k in kinds)


def sched_config(args: argparse.Namespace, **override: Any) -> SchedulerConfig:
    kw = {n: _from_cli(cf, getattr(args, n)) for n, cf in SCHED_FLAGS.items()
          if getattr(args, n, None) is not None}
    return _build(SchedulerConfig, {**kw, **override},
                  {n: cf.flag for n, cf in SCHED_FLAGS.items()})


@dataclass(frozen=True)
class RunConfig:
    """What the flags say: the caches, the scheduler, the KV pool (None: unlimited) and checks."""
    caches: tuple[CacheConfig, ...]
    sched: SchedulerConfig
    max_total_tokens: int | None
    check_invariants: bool
    seed: int

    def engine(self, cache: CacheConfig, sched: SchedulerConfig | None = None,
               name: str = "") -> EngineConfig:
        """An EngineConfig over this pool, rounded down to whole pages of `cache`."""
        tokens = whole_pages(self.max_total_tokens, cache.page_size)
        return _build(EngineConfig, dict(kv_capacity=tokens, cache=cache,
                                         sched=sched or self.sched,
                                         check_invariants=self.check_invariants, name=name),
                      {"kv_capacity": "--max-total-tokens"})


def whole_pages(tokens: int | None, page: int) -> int:
    if tokens is None:
        raise ValueError("--max-total-tokens is required here")
    if tokens < page:
        raise ValueError(f"--max-total-tokens {tokens:,} is smaller than one page of {page} "
                         f"tokens")
    return tokens - tokens % page


def check_pool(cfg: EngineConfig) -> None:
    """Refuse a KV pool the machine cannot hold, before anything else is built (SlotPool
    judges; its bookkeeping is what the run would allocate anyway)."""
    SlotPool(cfg.kv_capacity, cfg.cache.page_size)


def max_total_tokens(args: argparse.Namespace, kv_bytes_per_token: int | None,
                     default: int | None) -> int | None:
    text = args.kv_capacity
    if text is None:
        return default
    try:
        return parse_capacity(text, kv_bytes_per_token)
    except ValueError as e:
        raise ValueError(f"--max-total-tokens: {e}") from None


def configs_from_args(args: argparse.Namespace, *, kv_bytes_per_token: int | None = None,
                      default_tokens: int | None = None,
                      engine: EngineDefaults | None = None) -> RunConfig:
    """The configs the flags of add_config_flags describe. A byte-size --max-total-tokens is
    turned into tokens at `kv_bytes_per_token`; without the flag the pool is `default_tokens`
    (None: unlimited). `engine`: an engine preset (--engine) whose settings stand in for the
    flags not given."""
    if engine is not None:
        args = with_engine(args, engine)
    caches = cache_configs(args) if args.cache_mode else ()
    sched = sched_config(args, seed=0 if args.seed is None else args.seed)
    return RunConfig(caches, sched, max_total_tokens(args, kv_bytes_per_token, default_tokens),
                     bool(args.check_invariants), sched.seed)


def with_engine(args: argparse.Namespace, engine: EngineDefaults) -> argparse.Namespace:
    """A copy of args with the preset's settings where no flag was given: the scheduler's,
    and, for a command running one cache, the cache and its page (block) size."""
    out = argparse.Namespace(**vars(args))
    for name, value in engine.sched.items():
        if getattr(out, name) is None:
            setattr(out, name, value)
    if args.cache_mode == "one":
        if args.kind is None and not args.disable_radix_cache:
            out.kind = engine.cache
        if out.kind == "blockhash" and args.block_size is None:
            out.block_size = engine.page_size
        if out.kind in ("radix", "none") and args.page_size is None:
            out.page_size = engine.page_size
    return out


# ---- compare --config NAME:KEY=VALUE,... -------------------------------------------------
_BLOCK_KEYS = ("block-size", "block_size", "block")
_SHORT_KEYS = {"page": "page_size"}        # the spelling of the first --config specs


def _spec_keys() -> dict[str, tuple[ConfigFlag, bool]]:
    """key -> (its flag, whether the key negates the field): field names, and flag names
    and their aliases without the dashes, in dash or underscore form."""
    keys: dict[str, tuple[ConfigFlag, bool]] = {}
    for table in (CACHE_FLAGS, SCHED_FLAGS):
        for name, cf in table.items():
            for flag in (cf.flag, *cf.aliases):
                for k in (flag[2:], flag[2:].replace("-", "_")):
                    keys[k] = (cf, cf.negate)
            keys[name] = (cf, False)
    for short, name in _SHORT_KEYS.items():
        keys[short] = (CACHE_FLAGS[name], False)
    return keys


def _spec_value(cf: ConfigFlag, text: str, what: str) -> Any:
    kind = type(cf.default)
    if kind is bool:
        return parse_bool(text, what)
    if kind is str:
        return text
    try:
        return kind(text)
    except ValueError:
        expected = "an int" if kind is int else "a number"
        raise ValueError(f"{what}: bad value {text!r}: expected {expected}") from None


def parse_config_spec(spec: str, base: SchedulerConfig) -> tuple[str, CacheConfig, SchedulerConfig]:
    """'lpm16:cache=radix,page-size=16,radix-eviction-policy=lfu,schedule-policy=lpm' ->
    (name, cache, scheduler). Keys are the flag names without '--' (or the field names); the
    scheduler starts from `base` (the command line's scheduler flags)."""
    name, _, body = spec.rpartition(":")
    keys = _spec_keys()
    cache_kw: dict[str, Any] = {}
    sched_kw: dict[str, Any] = {}
    said: dict[str, str] = {}                       # field -> the key the spec used for it
    block: int | None = None
    for item in filter(None, (s.strip() for s in body.split(","))):
        k, eq, v = (x.strip() for x in item.partition("="))
        what = f"config key {k!r} in {spec!r}"
        if not eq:
            raise ValueError(f"config item {item!r} in {spec!r} is not key=value")
        if k in _BLOCK_KEYS:
            block, said["block_size"] = _spec_value(CACHE_FLAGS["page_size"], v, what), k
            continue
        if k not in keys:
            valid = [cf.flag[2:] for cf in (*CACHE_FLAGS.values(), *SCHED_FLAGS.values())]
            valid.insert(2, "block-size")
            raise ValueError(f"unknown config key {k!r} in {spec!r}; keys: {', '.join(valid)}")
        cf, negated = keys[k]
        value = _from_cli(cf, _spec_value(cf, v, what))
        kw = cache_kw if cf.owner is CacheConfig else sched_kw
        kw[cf.name] = not value if negated else value
        said[cf.name] = k
    try:
        kind = cache_kw.pop("kind", CACHE_FLAGS["kind"].default)
        _build(CacheConfig, {"kind": kind}, {"kind": said.get("kind", "cache")})
        _check_used([kind], cache_kw, block)
        cache = cache_config(kind, cache_kw, block)
        sched = _build(SchedulerConfig, {**dataclasses.asdict(base), **sched_kw}, said)
    except ValueError as e:
        raise ValueError(f"config {spec!r}: {e}") from None
    return name or body, cache, sched
