"""Routers name themselves once, in their class line; the registry and the class agree."""
from __future__ import annotations

import pytest

from radixkv.router import ROUTERS, ReplicaView, Router, RouterContext, make_router
from radixkv.router.simple import RoundRobin

NAMES = ["llm-d-precise", "dynamo-kv", "radixkv", "radixkv-fit", "round-robin", "power-of-two",
         "least-load", "ray-prefix-affinity", "session-hash", "sglang-cache-aware"]


def test_every_router_is_registered_under_its_own_name():
    assert sorted(ROUTERS.names()) == sorted(NAMES)
    for name in ROUTERS:
        assert ROUTERS.get(name).name == name


def test_a_named_subclass_registers_and_an_unnamed_one_does_not():
    before = ROUTERS.names()

    class Unnamed(Router):
        name = "unnamed-double"

        def route(self, request, replicas):
            return 0

    assert ROUTERS.names() == before

    class Last(Router, name="test-last"):
        def route(self, request, replicas):
            self.check_views(replicas)
            return self.n - 1

    try:
        assert Last.name == "test-last" and ROUTERS.get("test-last") is Last
        r = make_router("test-last", RouterContext(3))
        assert r.route(None, [ReplicaView()] * 3) == 2
    finally:
        ROUTERS.remove("test-last")
    assert ROUTERS.names() == before


def test_a_name_taken_or_empty_is_refused():
    with pytest.raises(ValueError, match="'round-robin' is already registered"):
        class Again(RoundRobin, name="round-robin"):
            pass
    with pytest.raises(ValueError, match="non-empty str"):
        class Empty(Router, name=""):
            pass
    assert ROUTERS.get("round-robin") is RoundRobin
