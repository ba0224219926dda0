"""`radixkv route`: the cache-aware gateway in front of any OpenAI-compatible fleet (radixkv, vLLM,
SGLang workers) — its workers, their KV events, the token ids it routes on, the HTTP proxy."""
