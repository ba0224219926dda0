"""The real model: a Llama-family Transformer over a paged KV pool with pluggable attention
backends (sdpa, batch-invariant), its checkpoint loader, tokenizer, sampling, and the
TorchExecutor that runs the scheduler's batches on it."""
