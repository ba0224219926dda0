"""`radixkv serve --replicas N` on Ray Serve: the ingress deployment, the engine replicas and
their event hub, and the radixkv routers as a Ray Serve RequestRouter."""
