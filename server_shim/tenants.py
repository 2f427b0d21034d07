"""API keys and the tenants they name: who owns a stored response.

A tenant is whoever holds one API key. Each stored response records its tenant's id, never
the key: the name given to the key (`alice sk-...` in a keys file), or `key-` and a hash of
the key when it has none. A request can only see, delete or continue the responses of its own
tenant; another tenant's response answers exactly as an unknown id does. Without configured
keys there is one anonymous tenant (`None`) and every response is visible to every client.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One accepted bearer key and the tenant it belongs to (the key itself never leaves here)."""

    key: str = field(repr=False)
    tenant: str


def anonymous_tenant_id(key: str) -> str:
    """A stable id for an unnamed key: a hash prefix, so logs and the store never hold the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


BEARER_KEY = re.compile(r"[A-Za-z0-9._~+/-]+=*")
"""What a bearer token can hold (RFC 6750's `b64token`): a key with any other character could not be sent
as one, so a key holding one is a mistake (a comment or list that was not meant to be part of it)."""

MIN_FILE_KEY_CHARS = 8
"""A shorter entry in a keys file is more likely a stray word or a tenant name without its key."""


def parse_key_entry(entry: str) -> ApiKey:
    """`KEY` or `TENANT KEY` (keys never contain whitespace); raises ValueError on anything else.

    The message never holds the key: it ends up in logs and on the terminal."""
    parts = entry.split()
    if len(parts) == 1:
        key, tenant = parts[0], None
    elif len(parts) == 2 and TENANT_NAME.fullmatch(parts[0]):
        tenant, key = parts
    else:
        hint = " ('#' starts a comment only at the beginning of a line)" if "#" in entry else ""
        raise ValueError(
            "an API key entry is 'KEY' or 'TENANT KEY' with a tenant name of letters, digits and '_.@-' (got "
            f"{len(parts)} field(s)){hint}"
        )
    if not BEARER_KEY.fullmatch(key):
        odd = "".join(sorted({c for c in key if not BEARER_KEY.fullmatch(c)} - {"="}))
        raise ValueError(
            f"an API key holds {odd or '='!r}: a bearer token holds only letters, digits and '-._~+/' (and '=' "
            "at its end), so no client could send this key"
        )
    return ApiKey(key, tenant or anonymous_tenant_id(key))


def parse_key_lines(text: str, source: str = "the keys file") -> list[ApiKey]:
    """A keys file: one `KEY` or `TENANT KEY` a line; blank lines and lines starting with `#` are skipped.

    Nothing else is taken apart (no commas, no comment after an entry): a line that is not exactly one
    entry, or whose key is shorter than `MIN_FILE_KEY_CHARS`, is refused with its line number, so a
    mistyped file stops start-up instead of quietly accepting a different key."""
    keys = []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), 1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        try:
            key = parse_key_entry(entry)
            if len(key.key) < MIN_FILE_KEY_CHARS:
                raise ValueError(
                    f"the key has {len(key.key)} characters, fewer than {MIN_FILE_KEY_CHARS}: a tenant name "
                    "without its key, or a stray word?"
                )
        except ValueError as exc:
            raise ValueError(f"{source}, line {number}: {exc}") from None
        keys.append(key)
    return keys


def load_keys(entries: Iterable[str], keys_file: str | Path | None) -> list[ApiKey]:
    """Every configured key: the settings' entries, then the file's; one key may not name two tenants.

    A keys file that is named and holds no key is an error, not "auth off": authentication fails closed."""
    keys = [parse_key_entry(entry) for entry in entries]
    if keys_file is not None:
        from_file = parse_key_lines(Path(keys_file).read_text(encoding="utf-8"), str(keys_file))
        if not from_file:
            raise ValueError(
                f"{keys_file} holds no key: a keys file that reads empty (emptied, or a pipe read twice) must not "
                "leave the server open"
            )
        keys.extend(from_file)
    tenants: dict[str, str] = {}
    for key in keys:
        if tenants.setdefault(key.key, key.tenant) != key.tenant:
            raise ValueError(f"one API key is given for two tenants: {tenants[key.key]!r} and {key.tenant!r}")
    return keys


def scope_tenant(scope: Any) -> str | None:
    """The tenant the authentication middleware found for this request or WebSocket (None: no keys)."""
    state = scope.get("state")
    return state.get("tenant") if isinstance(state, dict) else None
