"""The gateway's streamed replies (gateway/bridge.py) at the byte level: chunked framing with no
length, the worker's events byte for byte in order, the client's kept-alive connection serving
the next request after a stream, and the cached tokens read from the stream's tail; and
OpenAI's own client streaming through it from sim workers."""
from __future__ import annotations

import socket

import openai
from fastapi.responses import StreamingResponse

from radixkv.server.launch import ServerThread
from tests.gateway.test_route import MODEL, fleet, gateway, gw_metric, released, worker_app

EVENTS = [b'data: {"choices": [{"text": "%d"}]}\n\n' % i for i in range(40)] + [
    b'data: {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 17}}}\n\n',
    b"data: [DONE]\n\n"]


def request(path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body))


def read_response(f) -> tuple[bytes, bytes]:
    """(the head, the de-chunked body) of one chunked response from file `f`."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += f.readline()
    body = b""
    while True:
        size = int(f.readline().strip(), 16)
        data = f.read(size + 2)
        if size == 0:
            return head, body
        body += data[:-2]


def test_a_stream_is_chunked_byte_for_byte_and_the_connection_serves_the_next_request():
    app = worker_app()

    @app.post("/tokenize")
    async def tokenize():
        return {"tokens": [1, 2, 3], "count": 3}

    @app.post("/v1/completions")
    async def stream():
        async def gen():
            for e in EVENTS:
                yield e
        return StreamingResponse(gen(), media_type="text/event-stream")

    body = b'{"model": "%s", "prompt": "x", "stream": true}' % MODEL.encode()
    with ServerThread(app) as worker, gateway([worker], "round-robin") as (url, gw):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            f = s.makefile("rb")
            heads = []
            for _ in range(2):                 # one connection, two streams one after the other
                s.sendall(request("/v1/completions", body))
                head, got = read_response(f)
                heads.append(head.lower())
                assert got == b"".join(EVENTS)
        for head in heads:
            assert head.startswith(b"http/1.1 200") and b"transfer-encoding: chunked" in head
            assert b"content-length" not in head and b"text/event-stream" in head
        assert gw_metric(url, "radixkv_route_reported_cached_tokens_total") == 34
        released(gw)


def test_openais_client_streams_chat_and_completions_through_the_gateway():
    with fleet(1, events=False) as ws, gateway([ws[0][0]], "round-robin") as (url, gw):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
        chat = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        texts = list(client.completions.create(
            model=MODEL, prompt="hello there", max_tokens=7, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        assert [c.choices[0].finish_reason for c in chat if c.choices][-1] == "length"
        assert sum(1 for c in chat if c.choices and c.choices[0].delta.content) == 12
        assert chat[-1].usage.completion_tokens == 12
        assert sum(1 for c in texts if c.choices and c.choices[0].text) == 7
        assert texts[-1].usage.completion_tokens == 7
        released(gw)
