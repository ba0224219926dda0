"""The real model: a Llama-family Transformer over a paged KV pool, its configs, checkpoint
loader, tokenizer, sampling, and the TorchExecutor that runs the scheduler's batches on it."""
