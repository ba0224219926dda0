"""The router contract: one front end choosing, for each request, which of N replicas serves it.

A router is independent of what runs the replicas (the cluster simulator, a Ray Serve
deployment): it sees only the typed values below.

- `RequestInfo`: what a front end knows of a request before it is served (prompt token ids,
  cache namespace, routing key, arrival, output budget).
- `ReplicaView`: what a replica publishes about its load, read at the moment of routing.
- KV events: what each replica's cache stored and removed, either as the cache's `KVEvent`s
  (or the `EventRun`s a radix cache records) or as vLLM wire batches
  (radixkv.kvevents.wire), fed through `on_events`.

Call order, for every request: `route(request, views)` -> the replica index `i`; the caller
sends the request to replica `i` and calls `on_route(i, request)`; later, whenever a replica
publishes events, `on_events(replica, events)`; when the request finishes, `on_finish(i,
request)`; a front end that sees the response stream may also call `on_first_token(i,
request)` when the prefill is done. `route` is a decision only (it may advance a seeded random generator or a
round-robin cursor, nothing the hooks own); what a router remembers about sent requests it
records in `on_route`. Routers are built by the name their class line gives:
`make_router("radixkv", RouterContext(8))`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from radixkv.cache.events import EventRun, KVEvent
from radixkv.cache.key import RadixKey
from radixkv.kvevents.hashes import PageHashes, check_route_hash
from radixkv.kvevents.wire import EventBatch
from radixkv.registry import Registry
from radixkv.argcheck import finite_time, int_at_least, positive_int


@dataclass(frozen=True, slots=True, eq=False)
class RequestInfo:
    """A request as the router sees it. `session` is the routing key (the request's
    routing_key, else its conversation), None when it has neither."""
    rid: str
    tokens: Sequence[int]
    namespace: tuple[str | None, str | None] = (None, None)    # (extra_key, cache_salt)
    session: str | None = None
    arrival: float = 0.0
    max_new_tokens: int = 1
    key: RadixKey | None = None      # the prompt packed under `namespace`, when the caller has it

    def __post_init__(self):
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"RequestInfo.rid must be a non-empty str, got {self.rid!r}")
        if not len(self.tokens):
            raise ValueError(f"request {self.rid!r} has an empty prompt")
        if not isinstance(self.namespace, tuple) or len(self.namespace) != 2:
            raise ValueError(f"request {self.rid!r}: namespace must be (extra_key, cache_salt), "
                             f"got {self.namespace!r}")
        if self.key is not None and not (isinstance(self.key, RadixKey)
                                         and self.key.namespace == self.namespace
                                         and len(self.key) == len(self.tokens)):
            raise ValueError(f"request {self.rid!r}: key must be its prompt as a RadixKey of "
                             f"namespace {self.namespace!r}")
        finite_time(self.arrival, f"request {self.rid!r}: arrival")
        positive_int(self.max_new_tokens, f"request {self.rid!r}: max_new_tokens")

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)


class ReplicaView(NamedTuple):
    """One replica's published load, as of the routing moment."""
    waiting: int = 0            # requests queued, not admitted yet
    running: int = 0            # requests admitted (prefilling or decoding)
    prefill_tokens: int = 0     # prompt tokens of those requests not computed yet
    decode_tokens: int = 0      # output tokens those requests may still produce (their budgets)
    kv_used: int = 0            # KV slots in use (cached pages included)
    kv_capacity: int = 0        # KV slots of the replica (0: unknown)
    link_free_at: float = 0.0   # a disaggregated prefill worker: when the KV transfers it has
                                # queued are through its link (0: no link)

    @property
    def kv_usage(self) -> float:
        """kv_used / kv_capacity; 0.0 when the capacity is unknown."""
        return self.kv_used / self.kv_capacity if self.kv_capacity else 0.0

    @property
    def queue_len(self) -> int:
        """Requests the replica holds: what Ray Serve calls its queue length."""
        return self.waiting + self.running


class StepCost(Protocol):
    """What a cost-aware router prices work with (radixkv.sim.costmodel.CostModel, or a
    profile's): seconds of one engine step."""

    def step_time(self, prefill_segments: Sequence[tuple[int, int]] = (),
                  decode_context_lens: Sequence[int] = ()) -> float: ...


@dataclass(frozen=True)
class RouterContext:
    """What every router is built with: the replica count, the KV page size and hash of the
    replicas' events, a seed for randomised choices, and (for cost-aware routers) the cost
    model of one replica and its prefill chunk. `hash_memo`: whether the replicas' caches run
    in this process (a simulator), where a prompt's page hashes are mostly found in the memo
    their caches fill; a front end to remote workers hashes without it, at half the cost."""
    num_replicas: int
    page_size: int = 16
    hash_algo: str = "sha256"
    seed: int = 0
    cost: StepCost | None = None
    prefill_chunk: int = 8192
    hash_memo: bool = True

    def __post_init__(self):
        positive_int(self.num_replicas, "RouterContext.num_replicas")
        positive_int(self.page_size, "RouterContext.page_size")
        check_route_hash(self.hash_algo)
        int_at_least(self.seed, "RouterContext.seed", 0)
        positive_int(self.prefill_chunk, "RouterContext.prefill_chunk")
        if not isinstance(self.hash_memo, bool):
            raise ValueError(f"RouterContext.hash_memo must be True or False, "
                             f"got {self.hash_memo!r}")


Events = Sequence[KVEvent] | Sequence[EventRun] | EventBatch


class Router(ABC):
    """Chooses a replica per request. A subclass names itself in its class line, which sets
    `name` and registers it in ROUTERS: `class RoundRobin(Router, name="round-robin")` (a base
    or a test double given no name is not registered; it may set `name` itself). It may declare
    `Options` (a frozen, validated dataclass of its tunables, its defaults the published ones)
    and `uses_events` (True: the router reads KV events, so replicas must publish them)."""
    name: ClassVar[str]
    uses_events: ClassVar[bool] = False
    Options: ClassVar[type | None] = None

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if name is not None:
            if not isinstance(name, str) or not name:
                raise ValueError(f"router name must be a non-empty str, got {name!r}")
            cls.name = name
            ROUTERS.add(name, cls)

    def __init__(self, context: RouterContext, options: Any = None):
        self.context = context
        self.n = context.num_replicas
        if self.Options is None:
            if options is not None:
                raise ValueError(f"router {self.name!r} takes no options, got {options!r}")
        elif options is None:
            options = self.Options()
        elif not isinstance(options, self.Options):
            raise ValueError(f"router {self.name!r} takes {self.Options.__name__}, got "
                             f"{type(options).__name__}")
        self.options = options
        self._hashed: tuple[RequestInfo, PageHashes] | None = None    # the last request hashed

    @classmethod
    def default_options(cls) -> Any:
        """The Options a router built without any takes (None: it takes none)."""
        return None if cls.Options is None else cls.Options()

    @classmethod
    def check_options(cls, options: Any) -> None:
        """Refuse Options this router cannot run on beyond what they check themselves."""

    @abstractmethod
    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        """The index in [0, num_replicas) of the replica to send `request` to; `replicas` holds
        one view per replica, in index order."""

    def on_route(self, replica: int, request: RequestInfo) -> None:
        """`request` was sent to `replica`."""

    def on_events(self, replica: int, events: Events) -> None:
        """`replica` published these KV events (in order, after the ones already given)."""

    def on_first_token(self, replica: int, request: RequestInfo) -> None:
        """`request`, sent to `replica`, produced its first token: its prefill is done."""

    def on_finish(self, replica: int, request: RequestInfo) -> None:
        """`request`, sent to `replica`, has finished (or was aborted); `on_first_token` may not
        have been called for it."""

    def on_ttft(self, replica: int, request: RequestInfo, seconds: float) -> None:
        """`request`'s first token came back `seconds` after it arrived (measured by the front
        end: the gateway's clock, or the simulated one); called before `on_first_token`."""

    def held_index(self, replica: int):
        """The KVIndex this router keeps of what `replica` holds (fed by on_events), None when
        it keeps none: a front end that predicts hits reads it rather than a second copy."""
        return None

    def fit_quality(self):
        """How a prediction this router fits online tracks what it is fitted to (a
        ttft_fit.FitQuality), None when it fits nothing."""
        return None

    # ---- helpers for subclasses ---------------------------------------------------------------
    def check_views(self, replicas: Sequence[ReplicaView]) -> None:
        if len(replicas) != self.n:
            raise ValueError(f"router {self.name!r} routes over {self.n} replicas, got "
                             f"{len(replicas)} views")

    def check_replica(self, replica: int) -> int:
        if not isinstance(replica, int) or not 0 <= replica < self.n:
            raise ValueError(f"replica must be an int in [0, {self.n}), got {replica!r}")
        return replica

    def page_hashes(self, request: RequestInfo) -> PageHashes:
        """The chained hashes of the request's whole prompt pages, as the replicas emit them,
        hashed as far as they are read (kvevents/hashes.py); the same request asked again
        (route, then on_route, then its caller) is not rehashed."""
        last = self._hashed
        if last is not None and last[0] is request:
            return last[1]
        c = self.context
        hashes = PageHashes(request.tokens if request.key is None else request.key,
                            request.namespace, c.page_size, c.hash_algo, memo=c.hash_memo)
        self._hashed = (request, hashes)
        return hashes


ROUTERS: Registry[type[Router]] = Registry("router")


def make_router(name: str, context: RouterContext, options: Any = None) -> Router:
    """The router registered as `name`; importing radixkv.router registers every one."""
    return ROUTERS.get(name)(context, options)
