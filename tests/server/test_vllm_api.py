"""vLLM's own endpoints: /tokenize and /detokenize in vLLM's shapes (the ids a request with that
input runs on), the render endpoints vllm-router calls, /reset_prefix_cache (AllBlocksCleared on
the event stream, decoded with vLLM's own structs), /version and vllm:cache_config_info."""
from __future__ import annotations

import json

import httpx
import pytest
import zmq

from radixkv import __version__
from radixkv.cache.events import chain_hash
from radixkv.cache.key import RadixKey
from radixkv.kvevents.publisher import KVEventsConfig
from radixkv.server.tenants import Tenants
from tests.kvevents import vllm_structs as V
from tests.server._helpers import check_clean, client, metric, on_engine, running_server, wait_idle

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def sim():
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=8192) as s:
        yield s


def post(url: str, path: str, body) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def test_tokenize_a_prompt_and_messages_as_the_server_runs_them(sim):
    url, state = sim
    r = post(url, "/tokenize", {"prompt": "héllo"}).json()
    assert r == {"count": 7, "max_model_len": 8192,
                 "tokens": [256, 104, 195, 169, 108, 108, 111], "token_strs": None}
    bare = post(url, "/tokenize", {"prompt": "héllo", "add_special_tokens": False,
                                   "return_token_strs": True}).json()
    assert bare["tokens"] == [104, 195, 169, 108, 108, 111] and bare["count"] == 6
    assert bare["token_strs"] == ["h", "\ufffd", "\ufffd", "l", "l", "o"]
    chat = post(url, "/tokenize", {"model": "llama-3-8b", "messages": MSGS}).json()
    assert chat["tokens"] == state.template.encode([(m["role"], m["content"]) for m in MSGS])
    # the ids are the ones a chat request runs on: its usage counts exactly them
    use = client(url).chat.completions.create(model="llama-3-8b", messages=MSGS, max_tokens=2)
    assert use.usage.prompt_tokens == chat["count"] == len(chat["tokens"])
    wait_idle(state)
    check_clean(state)


@pytest.mark.parametrize("body, status, message", [
    ({}, 400, "give exactly one of prompt and messages"),
    ({"prompt": "a", "messages": MSGS}, 400, "give exactly one of prompt and messages"),
    ({"prompt": "a", "model": "gpt-4"}, 404, "The model `gpt-4` does not exist"),
    ({"messages": MSGS, "add_generation_prompt": False}, 400, "add_generation_prompt=false"),
    ({"messages": []}, 400, "messages"),
])
def test_tokenize_refuses_bad_bodies(sim, body, status, message):
    url, _ = sim
    r = post(url, "/tokenize", body)
    assert r.status_code == status and message in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/v1/completions", "/v1/chat/completions"])
def test_a_lone_surrogate_quoted_in_an_error_is_escaped_and_the_connection_kept(sim, path):
    # regression: the 404 naming a model `\udfff x` failed its own encoding (a 500, the
    # connection dropped under the gateway's pool)
    url, _ = sim
    body = b'{"model": "\\udfff x", "prompt": "a", "messages": [{"role": "user", "content": "a"}]}'
    if path != "/v1/chat/completions":
        body = body.replace(b', "messages": [{"role": "user", "content": "a"}]', b"")
    else:
        body = body.replace(b', "prompt": "a"', b"")
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 404
        assert r.json()["error"]["message"].startswith("The model `\\udfff x` does not exist")
        assert c.post("/tokenize", json={"prompt": "a"}).status_code == 200   # same connection
        assert r.headers.get("connection") != "close"


def test_detokenize_round_trips_and_refuses_ids_outside_the_vocabulary(sim):
    url, state = sim
    ids = post(url, "/tokenize", {"prompt": "naïve text", "add_special_tokens": False}).json()
    assert post(url, "/detokenize", {"tokens": ids["tokens"]}).json() == {"prompt": "naïve text"}
    bad = post(url, "/detokenize", {"tokens": [1, state.vocab_size]})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == (f"token id {state.vocab_size} is outside the "
                                              f"vocabulary [0, {state.vocab_size})")
    negative = post(url, "/detokenize", {"tokens": [-1]})
    assert negative.status_code == 400 and "token id -1 is outside" in negative.text


def test_render_gives_the_ids_and_sampling_the_engine_would_run(sim):
    url, state = sim
    done = metric(url, "vllm:request_success_total")
    comp = post(url, "/v1/completions/render", {"model": "llama-3-8b", "prompt": "hi",
                                                "max_tokens": 3, "temperature": 0}).json()
    assert isinstance(comp, list) and len(comp) == 1
    assert comp[0]["token_ids"] == [256, 104, 105] and comp[0]["model"] == "llama-3-8b"
    assert comp[0]["sampling_params"]["max_tokens"] == 3
    assert comp[0]["sampling_params"]["temperature"] == 0
    assert comp[0]["request_id"].startswith("cmpl-")
    chat = post(url, "/v1/chat/completions/render", {"messages": MSGS}).json()
    assert chat["token_ids"] == post(url, "/tokenize", {"messages": MSGS}).json()["tokens"]
    assert chat["request_id"].startswith("chatcmpl-")
    too_long = post(url, "/v1/completions/render", {"prompt": [1] * 8190, "max_tokens": 10})
    assert too_long.status_code == 400 and "maximum context length" in too_long.text
    # nothing was run
    assert on_engine(state, lambda e: e.has_work()) is False
    assert metric(url, "vllm:request_success_total") == done


def test_version_and_cache_config_info(sim):
    url, _ = sim
    assert httpx.get(f"{url}/version").json() == {"version": __version__}
    info = [ln for ln in httpx.get(f"{url}/metrics").text.splitlines()
            if ln.startswith("vllm:cache_config_info{")]
    assert info == ['vllm:cache_config_info{block_size="1",cache_dtype="auto",'
                    'enable_prefix_caching="True",engine="0",num_cpu_blocks="None",'
                    'num_gpu_blocks="8192",prefix_caching_hash_algo="sha256"} 1.0']


def test_reset_prefix_cache_empties_the_tree_and_arrives_as_all_blocks_cleared():
    events = KVEventsConfig(True, "zmq", "tcp://127.0.0.1:0")
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=4096,
                        kv_events=events) as (url, state):
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(state.info["kv_events"]["endpoint"])
        try:
            batches = []

            def drain(until):
                while not until():
                    assert sub.poll(5000), "no KV event batch arrived"
                    _, _, payload = sub.recv_multipart()
                    batches.append(V.DECODER.decode(payload))

            c = client(url)
            # a SUB socket misses what was sent before it joined: send until a batch arrives
            for _ in range(50):
                c.completions.create(model="llama-3-8b", prompt=[7, 8, 9], max_tokens=2)
                if sub.poll(100):
                    break
            prompt = list(range(10, 74))
            want = chain_hash(None, (None, None), RadixKey(prompt).page(0, 1), "sha256")
            c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2)

            def stored():
                return [e for b in batches for e in b.events if isinstance(e, V.BlockStored)]
            drain(lambda: any(e.block_hashes[0] == want for e in stored()))
            first = next(e for e in stored() if e.block_hashes[0] == want)
            assert first.parent_block_hash is None and first.token_ids[:63] == prompt[:63]
            assert first.block_size == 1 and first.medium == "GPU" and first.lora_name is None
            wait_idle(state)
            assert on_engine(state, lambda e: e.cache.total_size()) > 0
            assert httpx.post(f"{url}/reset_prefix_cache").status_code == 200
            drain(lambda: isinstance(batches[-1].events[-1], V.AllBlocksCleared))
            assert on_engine(state, lambda e: e.cache.total_size()) == 0
            check_clean(state)
        finally:
            sub.close()


def test_reset_prefix_cache_needs_the_operator_key_with_tenants(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": {"sk-a": "alice"}, "admin_keys": ["sk-op"]}))
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=4096,
                        tenants=Tenants.load(keys)) as (url, state):
        plain = httpx.post(f"{url}/reset_prefix_cache", headers={"authorization": "Bearer sk-a"})
        assert plain.status_code == 403
        ok = httpx.post(f"{url}/reset_prefix_cache", headers={"authorization": "Bearer sk-op"})
        assert ok.status_code == 200
        assert post(url, "/tokenize", {"prompt": "a"}).status_code == 401
        assert httpx.post(f"{url}/tokenize", json={"prompt": "a"},
                          headers={"authorization": "Bearer sk-a"}).status_code == 200


@pytest.mark.parametrize("cache", ["radix", "blockhash"])
def test_a_vllm_subscriber_rebuilds_exactly_the_trees_pages(cache):
    """Every batch of a whole run (replayed from seq 0) decodes with vLLM's own structs, and the
    pages they leave held are the cache's pages, evictions included."""
    from radixkv.config import CacheConfig
    events = KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    page = 1 if cache == "radix" else 16
    with running_server(executor="sim", model="llama-3-8b", kv_capacity=1024, kv_events=events,
                        cache=CacheConfig(cache, page)) as (url, state):
        c = client(url)
        for i in range(12):                       # shared prefixes, branches, and evictions
            prompt = list(range(100, 100 + 48 * (i % 3 + 1))) + [i] * (40 + 7 * i)
            c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=3)
        wait_idle(state)
        httpx.post(f"{url}/reset_prefix_cache")
        c.completions.create(model="llama-3-8b", prompt=list(range(500, 600)), max_tokens=3)
        wait_idle(state)
        replay = zmq.Context.instance().socket(zmq.DEALER)
        replay.setsockopt(zmq.LINGER, 0)
        replay.connect(state.info["kv_events"]["replay_endpoint"])
        held: dict = {}
        kinds = set()
        try:
            replay.send_multipart([b"", (0).to_bytes(8, "big")])
            while True:
                assert replay.poll(5000), "the replay socket went quiet"
                _, seq, payload = replay.recv_multipart()
                if int.from_bytes(seq, "big", signed=True) == -1:
                    break
                for e in V.DECODER.decode(payload).events:        # raises on any bad batch
                    kinds.add(type(e).__name__)
                    if isinstance(e, V.BlockStored):
                        for h in e.block_hashes:
                            held[h] = held.get(h, 0) + 1
                    elif isinstance(e, V.BlockRemoved):
                        for h in e.block_hashes:
                            held[h] -= 1
                            if not held[h]:
                                del held[h]
                    else:
                        held.clear()
        finally:
            replay.close()
        assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
        assert set(held) == on_engine(state, lambda e: e.cache.events().page_hashes())
        check_clean(state)
