"""Workloads: seeded generators and trace readers, all producing a `Workload` of
`TraceRequest`s (token ids, arrival seconds, explicit outputs where known)."""
from .chat import multiturn, support
from .chatlog import read_chat_log, render_prompt
from .generators import GENERATORS, load_workload, make_workload, trace_format
from .prefix import burst, fewshot, rag, tree
from .record import (MAX_REQUEST_TOKENS, MAX_WORKLOAD_REQUESTS, MAX_WORKLOAD_TOKENS,
                     TOKEN_ID_LIMIT, TraceFormatError, TraceRequest, Workload, read_jsonl,
                     write_jsonl)
from .traces import block_reuse_ratio, read_hash_id_trace, read_mooncake, scan_hash_id_trace

__all__ = [
    "GENERATORS", "MAX_REQUEST_TOKENS", "MAX_WORKLOAD_REQUESTS", "MAX_WORKLOAD_TOKENS",
    "TOKEN_ID_LIMIT", "TraceFormatError", "TraceRequest", "Workload", "block_reuse_ratio",
    "burst", "fewshot", "load_workload", "make_workload", "multiturn", "rag",
    "read_chat_log", "read_hash_id_trace", "read_jsonl", "read_mooncake", "render_prompt",
    "scan_hash_id_trace", "support", "trace_format", "tree", "write_jsonl",
]
