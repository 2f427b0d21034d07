"""Requests a web page made a browser send: refused, so a page cannot drive a sidecar on localhost.

A sidecar with no API key (the default on loopback) answers whoever reaches its port, and a browser
on the same machine reaches it: any web page could open a WebSocket to it (browsers apply no
same-origin rule to WebSockets; the page reads the answers) or POST a `text/plain` body (a "simple"
request: no CORS preflight), spending the backend credentials the shim holds. DNS rebinding
(a hostile name re-pointed at 127.0.0.1) does the same under the page's own origin. Three checks,
each a plain decision on the request's method and headers (no I/O):

- `Origin`: browsers send it on every WebSocket and every cross-origin POST; the SDKs, `websockets`,
  `httpx`, curl and Codex send none. A request carrying one not in `allowed_origins` gets 403
  `origin_not_allowed`.
- `Host`: bound to a loopback address, the server answers only Host names that are loopback
  (`localhost`, `127.0.0.1`, `[::1]`, any port) or in `allowed_hosts`; else 403 `host_not_allowed`.
  Bound elsewhere, any Host is answered unless `allowed_hosts` is set (then: loopback names and those).
- `Content-Type`: a POST with a body must say JSON (`application/json`, or `application/...+json`);
  `text/plain`, forms and the rest get 415 `unsupported_media_type`. A body with no type at all is
  read as JSON (raw HTTP clients often omit it; a browser that sends a body without one sends an
  `Origin` too).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import APIError

COMMON_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
"""Host names answered without parsing (`is_loopback` decides the rest)."""


def is_loopback(host: str) -> bool:
    """A loopback name or address: `localhost` (and `*.localhost`, which browsers keep on this machine), 127/8, ::1."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The host of a `Host` header value, without the port: `[::1]:8787` -> `::1`, `Example.COM:80` -> `example.com`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _origin(value: str) -> str:
    return value.strip().lower().rstrip("/")


@dataclass(frozen=True)
class BrowserGuard:
    """What `refusal` allows: origins (`*`: any), hosts (`*`: any), and whether a Host must be loopback."""

    origins: frozenset[str]
    hosts: frozenset[str]
    loopback_only: bool

    @property
    def any_origin(self) -> bool:
        return "*" in self.origins

    @classmethod
    def build(cls, bind_host: str, allowed_origins: Iterable[str], allowed_hosts: Iterable[str]) -> BrowserGuard:
        hosts = frozenset(host_name(h) if h != "*" else h for h in allowed_hosts)
        return cls(frozenset(_origin(o) for o in allowed_origins), hosts, is_loopback(bind_host) and "*" not in hosts)

    def refusal(self, method: str, headers: Iterable[tuple[bytes, bytes]]) -> APIError | None:
        """Why this request (its method and raw headers, as ASGI gives them) is refused, or None."""
        named = dict(headers)  # one C-level pass: a repeated header counts by its last value
        origin = named.get(b"origin")
        if origin is not None and not self.any_origin and _origin(origin.decode("latin-1")) not in self.origins:
            return _origin_refused(origin.decode("latin-1"))
        host = named.get(b"host")
        if host is not None and not self._host_value_allowed(host):
            return _host_refused(host.decode("latin-1"))
        if method == "POST":
            content_type = named.get(b"content-type")
            if (
                content_type is not None
                and content_type != b"application/json"
                and not is_json(content_type.decode("latin-1"))
                and _has_body(named)
            ):
                return _not_json(content_type.decode("latin-1"))
        return None

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a guard lives as long as its app
    def _host_value_allowed(self, value: bytes) -> bool:
        """Per raw Host value (a client sends the same one on every request), so each is parsed once."""
        return self._host_allowed(host_name(value.decode("latin-1")))

    def _host_allowed(self, host: str) -> bool:
        """Loopback names always (a rebinding attack brings a name of its own), listed ones, and any other only
        when bound off loopback with no list."""
        if host in COMMON_LOOPBACK or host in self.hosts or "*" in self.hosts or is_loopback(host):
            return True
        return not self.loopback_only and not self.hosts


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() not in (b"0", b""))


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _origin_refused(origin: str) -> APIError:
    return APIError(
        403,
        "origin_not_allowed",
        f"Requests from the web origin '{origin[:200]}' are not allowed: a browser page cannot use this server. "
        "To allow one, add it to the server's allowed_origins (RESPONSES_WS_ALLOWED_ORIGINS).",
    )


def _host_refused(host: str) -> APIError:
    return APIError(
        403,
        "host_not_allowed",
        f"The Host '{host[:200]}' is not one this server answers to (it listens on loopback). "
        "To allow it, add it to the server's allowed_hosts (RESPONSES_WS_ALLOWED_HOSTS).",
    )


def _not_json(content_type: str) -> APIError:
    return APIError(
        415,
        "unsupported_media_type",
        f"The request body must be JSON: send 'Content-Type: application/json' (got '{content_type[:200]}').",
    )
