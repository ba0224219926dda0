"""KV-cache events in vLLM's format: the wire structs and encoding, the ZMQ publisher a server
runs, and the subscriber index (`KVIndex`) that rebuilds which pages a server holds."""
