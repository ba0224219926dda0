"""Tenant isolation in both directions: the same tenant hits, another tenant misses on identical
tokens; the operator's shared namespace is shared by all; client salts only when allowed."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixkv.server.tenants import AuthError, Tenants
from tests.server._helpers import check_clean, client, running_server

KEYS = {"keys": {"sk-alpha": "alpha", "sk-beta": "beta"}, "shared_namespace": "common",
        "admin_keys": ["sk-operator"]}
PROMPT = list(range(2000, 2400))


def cached(c: openai.OpenAI, prompt=PROMPT, **extra) -> int:
    r = c.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2,
                             extra_body=extra or None)
    return r.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def tenants_server():
    with running_server(executor="sim", model="llama-3-8b", tenants=Tenants.from_obj(KEYS),
                        allow_client_cache_salt=True) as s:
        yield s


def test_same_tenant_hits_other_tenant_misses(tenants_server):
    url, state = tenants_server
    alpha, beta = client(url, "sk-alpha"), client(url, "sk-beta")
    prompt = PROMPT[:300]
    assert cached(alpha, prompt) == 0
    assert cached(alpha, prompt) == 299            # same tenant: the whole prompt but one
    assert cached(beta, prompt) == 0               # identical tokens, another tenant: a miss
    assert cached(beta, prompt) == 299
    check_clean(state)


def test_shared_namespace_is_shared_by_all_tenants(tenants_server):
    url, state = tenants_server
    alpha, beta = client(url, "sk-alpha"), client(url, "sk-beta")
    prompt = PROMPT[100:]
    assert cached(alpha, prompt, cache_scope="shared") == 0
    assert cached(beta, prompt, cache_scope="shared") == 299       # alpha's prefix, in common
    assert cached(beta, prompt) == 0               # beta's own namespace still misses
    check_clean(state)


def test_client_salt_stays_inside_the_tenant(tenants_server):
    url, _ = tenants_server
    alpha, beta = client(url, "sk-alpha"), client(url, "sk-beta")
    prompt = PROMPT[50:250]
    assert cached(alpha, prompt, cache_salt="s1") == 0
    assert cached(alpha, prompt, cache_salt="s1") == 199
    assert cached(alpha, prompt, cache_salt="s2") == 0       # another salt: another namespace
    assert cached(beta, prompt, cache_salt="s1") == 0        # the same salt, another tenant


def test_keys_are_required_and_checked(tenants_server):
    url, _ = tenants_server
    with pytest.raises(openai.AuthenticationError):
        client(url, "sk-gamma").completions.create(model="llama-3-8b", prompt="hi", max_tokens=1)
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{url}/health").status_code == 200       # operations need no key


def test_only_an_admin_key_flushes_every_tenants_cache(tenants_server):
    url, state = tenants_server
    cached(client(url, "sk-alpha"), PROMPT[:64])
    for key in ("sk-alpha", "sk-beta", "nope"):
        r = httpx.post(f"{url}/flush_cache", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 403 and "admin_keys" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/flush_cache").status_code == 403
    assert state.worker.call(lambda e: e.cache.total_size()).result(10) > 0
    r = httpx.post(f"{url}/flush_cache", headers={"Authorization": "Bearer sk-operator"})
    assert r.status_code == 200
    assert state.worker.call(lambda e: e.cache.total_size()).result(10) == 0


def test_without_shared_namespace_or_keys():
    with running_server(executor="sim", model="llama-3-8b") as (url, state):
        c = client(url)
        with pytest.raises(openai.BadRequestError, match="shared namespace"):
            cached(c, cache_scope="shared")
        with pytest.raises(openai.BadRequestError, match="--allow-client-cache-salt"):
            cached(c, cache_salt="x")
        assert cached(c) == 0 and cached(c) == 399
        check_clean(state)


def test_keys_file_errors(tmp_path):
    p = tmp_path / "keys.json"
    for text, needle in [("{", "malformed JSON"), ("[]", "JSON object"),
                         ('{"keys": {}}', "non-empty"), ('{"keys": {"k": ""}}', "non-empty"),
                         ('{"keys": {"k": "t"}, "extra": 1}', "unknown field 'extra'"),
                         ('{"keys": {"k": "t"}, "shared_namespace": ""}', "shared_namespace"),
                         ('{"keys": {"k": "t"}, "admin_keys": "a"}', "admin_keys"),
                         ('{"keys": {"k": "t"}, "admin_keys": ["k"]}', "both")]:
        p.write_text(text)
        with pytest.raises(ValueError, match=needle):
            Tenants.load(p)
    p.write_text(json.dumps(KEYS))
    t = Tenants.load(p)
    assert t.tenant_of("Bearer sk-beta") == "beta"
    with pytest.raises(AuthError):
        t.tenant_of("Bearer sk-zeta")
    with pytest.raises(AuthError):
        t.tenant_of(None)
    assert t.cache_salt("alpha", "tenant", None, False) == "tenant:alpha"
    assert t.cache_salt("alpha", "shared", "x", True) == "shared:common/client:x"
    with pytest.raises(FileNotFoundError):
        Tenants.load(tmp_path / "missing.json")
