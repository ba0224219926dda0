"""The HTTP server: an OpenAI-compatible API over the engine, with metrics, KV events and tenants."""
