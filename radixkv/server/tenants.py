"""Tenants: API keys -> tenant, and the cache namespace (cache salt) each request gets.

The salt is derived on the server, never taken from the client as is: identical tokens of two
tenants live in different namespaces, so one tenant can neither hit nor time another's
prefixes. The keys file (`--api-keys FILE`) is JSON:

    {"keys": {"sk-alpha-1": "alpha", "sk-beta-1": "beta"}, "shared_namespace": "common",
     "admin_keys": ["sk-operator"]}

`shared_namespace` (optional) names a namespace every tenant may opt into per request with
`"cache_scope": "shared"` — for a common system prompt whose KV all tenants should reuse.
A request's own `cache_salt` is honoured only with `--allow-client-cache-salt`, and then only
inside its tenant's (or the shared) namespace. Operations that touch every tenant's prefixes
(`/flush_cache`) need one of the operator's `admin_keys` (optional; none: refused).
"""
from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from pathlib import Path


class AuthError(Exception):
    """A request without a valid API key (401)."""


@dataclass(frozen=True)
class Tenants:
    keys: dict[str, str] = field(default_factory=dict)     # API key -> tenant
    shared_namespace: str | None = None
    admin_keys: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    @classmethod
    def load(cls, path: str | Path) -> "Tenants":
        path = Path(path)
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"--api-keys: {str(path)!r} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--api-keys {str(path)!r}: malformed JSON ({e})") from None
        return cls.from_obj(obj, f"--api-keys {str(path)!r}")

    @classmethod
    def from_obj(cls, obj: object, where: str = "api keys") -> "Tenants":
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object with \"keys\", got "
                             f"{type(obj).__name__}")
        unknown = set(obj) - {"keys", "shared_namespace", "admin_keys"}
        if unknown:
            raise ValueError(f"{where}: unknown field {sorted(unknown)[0]!r}; fields: keys, "
                             f"shared_namespace, admin_keys")
        keys = obj.get("keys")
        if not isinstance(keys, dict) or not keys:
            raise ValueError(f"{where}: \"keys\" must be a non-empty object of API key -> tenant")
        for k, t in keys.items():
            if not k.strip() or not isinstance(t, str) or not t.strip():
                raise ValueError(f"{where}: key {k!r} -> {t!r}: keys and tenants must be "
                                 f"non-empty strings")
        shared = obj.get("shared_namespace")
        if shared is not None and (not isinstance(shared, str) or not shared.strip()):
            raise ValueError(f"{where}: shared_namespace must be a non-empty string, got {shared!r}")
        admin = obj.get("admin_keys", [])
        if not isinstance(admin, list) or not all(isinstance(k, str) and k.strip() for k in admin):
            raise ValueError(f"{where}: admin_keys must be a list of non-empty strings, got "
                             f"{admin!r}")
        clash = set(admin) & set(keys)
        if clash:
            raise ValueError(f"{where}: key {sorted(clash)[0]!r} is both a tenant's and an admin key")
        return cls(dict(keys), shared, tuple(admin))

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of an `Authorization: Bearer KEY` header; None when tenants are off."""
        if not self.enabled:
            return None
        key = _bearer(authorization)
        if key is None:
            raise AuthError("missing API key: send Authorization: Bearer KEY")
        for known, tenant in self.keys.items():
            if _same(known, key):
                return tenant
        raise AuthError("invalid API key")

    def check_admin(self, authorization: str | None) -> None:
        """Raises AuthError unless tenants are off or the header carries an admin key."""
        if not self.enabled:
            return
        key = _bearer(authorization)
        if key is None or not any(_same(a, key) for a in self.admin_keys):
            raise AuthError("this operation touches every tenant's cache: it needs one of the "
                            "operator's admin_keys (in --api-keys)")

    def cache_salt(self, tenant: str | None, scope: str, client_salt: str | None,
                   allow_client_salt: bool) -> str | None:
        """The namespace a request's KV lives in. Raises ValueError for a salt or scope the
        server does not allow."""
        if client_salt is not None and not allow_client_salt:
            raise ValueError("cache_salt is not accepted by this server (start it with "
                             "--allow-client-cache-salt)")
        if scope == "shared":
            if self.shared_namespace is None:
                raise ValueError("cache_scope 'shared': this server names no shared namespace "
                                 "(\"shared_namespace\" in --api-keys)")
            base = f"shared:{self.shared_namespace}"
        elif tenant is not None:
            base = f"tenant:{tenant}"
        else:
            return None if client_salt is None else f"client:{client_salt}"
        return base if client_salt is None else f"{base}/client:{client_salt}"


def _bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, or None."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def _same(known: str, given: str) -> bool:
    return hmac.compare_digest(known.encode(), given.encode())      # in constant time
