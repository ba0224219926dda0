"""Workloads: seeded generators and trace readers, all producing a `Workload` of
`TraceRequest`s (token ids, arrival seconds, explicit outputs where known)."""
from .chat import multiturn, support
from .generators import GENERATORS, load_workload, make_workload
from .prefix import burst, fewshot, rag, tree
from .record import TraceFormatError, TraceRequest, Workload, read_jsonl, write_jsonl
from .traces import block_reuse_ratio, read_hash_id_trace, read_mooncake, scan_hash_id_trace

__all__ = [
    "GENERATORS", "TraceFormatError", "TraceRequest", "Workload", "block_reuse_ratio",
    "burst", "fewshot", "load_workload", "make_workload", "multiturn", "rag",
    "read_hash_id_trace", "read_jsonl", "read_mooncake", "scan_hash_id_trace", "support",
    "tree", "write_jsonl",
]
