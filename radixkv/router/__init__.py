"""Routers: one front end choosing a replica per request (radixkv.router.base has the
contract). Importing this package registers every router in ROUTERS."""
from radixkv.router import (dynamo, llmd, radixkv, ray, session, sglang,  # noqa: F401  (register)
                            simple)
from radixkv.router.base import (ROUTERS, ReplicaView, RequestInfo, Router, RouterContext,
                                 make_router)

__all__ = ["ROUTERS", "ReplicaView", "RequestInfo", "Router", "RouterContext", "make_router"]
