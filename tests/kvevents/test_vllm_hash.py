"""vLLM's block hashes (kvevents/vllm_hash.py) against values vLLM 0.32's own hashing functions
gave for the same prompts (vllm.utils.hashing.sha256 / sha256_cbor chained as
kv_cache_utils.hash_block_tokens chains them, NONE_HASH from the seed "vllm-none-hash", the event
int as maybe_convert_block_hash takes it), and PageHashes giving the same span by span."""
from __future__ import annotations

import pytest

from radixkv.kvevents import vllm_hash
from radixkv.kvevents.hashes import PageHashes, page_hashes
from radixkv.router import RouterContext

PROMPT = list(range(1000, 1100))          # three whole 32-token blocks and 4 tokens left
VLLM = {                                  # (scheme, cache_salt) -> the first three event hashes
    ("vllm-sha256", None): [0xd0f10cad6e0ec692, 0x483b51bb134f02d2, 0x210d1222b0fde2a8],
    ("vllm-sha256", "s1"): [0x3aee8e01062b1b90, 0x14cbc821127cd3eb, 0x3f5265d98585d28a],
    ("vllm-sha256-cbor", None): [0x5a82f560cae5005b, 0x89f091f01b95029a, 0x30b01e7090420cc3],
    ("vllm-sha256-cbor", "s1"): [0xfd34565bd8c12f03, 0x954f9d85dddbdf79, 0x1f9be5915d70a58d],
}


@pytest.mark.parametrize("scheme, salt", list(VLLM))
def test_the_hashes_are_vllms(scheme, salt):
    assert vllm_hash.block_hashes(PROMPT, 32, scheme, salt) == VLLM[scheme, salt]
    assert page_hashes(PROMPT, (None, salt), 32, scheme, memo=False) == VLLM[scheme, salt]


def test_a_salt_changes_every_block_and_a_seed_the_chain():
    plain = vllm_hash.block_hashes(PROMPT, 32)
    assert not set(plain) & set(vllm_hash.block_hashes(PROMPT, 32, cache_salt="s1"))
    seeded = vllm_hash.block_hashes(PROMPT, 32, seed="42")       # PYTHONHASHSEED=42 on the engine
    assert not set(plain) & set(seeded)


@pytest.mark.parametrize("scheme", list(vllm_hash.VLLM_SCHEMES))
def test_page_hashes_read_span_by_span_equal_the_whole_chain(scheme):
    tokens = [(7 * i) % 8192 for i in range(300)]        # 300 one-token pages: five spans
    whole = vllm_hash.block_hashes(tokens, 1, scheme, "salt")
    lazy = PageHashes(tokens, (None, "salt"), 1, scheme, memo=False)
    assert lazy[3] == whole[3] and lazy.done == 64       # one span hashed to read page 3
    assert lazy[64:130] == whole[64:130]
    assert list(lazy) == whole and len(lazy) == 300


def test_a_prefix_shares_the_hashes_of_its_whole_blocks():
    a = vllm_hash.block_hashes(PROMPT, 32)
    b = vllm_hash.block_hashes(PROMPT[:64] + [5] * 40, 32)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_the_engine_names_map_to_schemes():
    assert vllm_hash.scheme_of("sha256") == "vllm-sha256"
    assert vllm_hash.scheme_of("sha256_cbor") == "vllm-sha256-cbor"
    assert vllm_hash.scheme_of("xxhash") is None            # a random seed per process


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown vLLM hash scheme 'sha256'"):
        vllm_hash.block_hashes(PROMPT, 32, "sha256")
    with pytest.raises(ValueError, match="extra key 'lora-a'"):
        PageHashes(PROMPT, ("lora-a", None), 32, "vllm-sha256")
    with pytest.raises(ValueError, match="unknown hash 'vllm-xxhash'"):
        RouterContext(2, 32, "vllm-xxhash")
    assert RouterContext(2, 32, "vllm-sha256-cbor").hash_algo == "vllm-sha256-cbor"
