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


def parse_key_entry(entry: str) -> ApiKey:
    """`KEY` or `TENANT KEY` (keys never contain whitespace); raises ValueError on anything else."""
    parts = entry.split()
    if len(parts) == 1:
        return ApiKey(parts[0], anonymous_tenant_id(parts[0]))
    if len(parts) == 2 and TENANT_NAME.fullmatch(parts[0]):
        return ApiKey(parts[1], parts[0])
    raise ValueError(
        "an API key entry is 'KEY' or 'TENANT KEY' with a tenant name of letters, digits and '_.@-' (got "
        f"{len(parts)} field(s))"
    )


def parse_key_lines(text: str) -> list[ApiKey]:
    """Entries one per line (or separated by commas); blank lines and `#` comments are skipped."""
    keys = []
    for line in text.replace(",", "\n").splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            keys.append(parse_key_entry(entry))
    return keys


def load_keys(entries: Iterable[str], keys_file: str | Path | None) -> list[ApiKey]:
    """Every configured key: the settings' entries, then the file's; one key may not name two tenants."""
    keys = [parse_key_entry(entry) for entry in entries]
    if keys_file is not None:
        keys.extend(parse_key_lines(Path(keys_file).read_text()))
    tenants: dict[str, str] = {}
    for key in keys:
        if tenants.setdefault(key.key, key.tenant) != key.tenant:
            raise ValueError(f"one API key is given for two tenants: {tenants[key.key]!r} and {key.tenant!r}")
    return keys


def scope_tenant(scope: Any) -> str | None:
    """The tenant the authentication middleware found for this request or WebSocket (None: no keys)."""
    state = scope.get("state")
    return state.get("tenant") if isinstance(state, dict) else None
