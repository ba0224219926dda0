"""The HTTP load client and the experiments that drive running servers: `bench-serve` (any
OpenAI-compatible server), `four-way` (four `radixkv serve` configurations), the server process."""
