"""Per-tenant quotas of the Redis store: a tenant over its share drops its own oldest responses, never another's.

Kept beside each tenant's entries, with their TTL: a sorted set of its response ids by save
time, each id's bytes and history list, each list's bytes and how many of the tenant's entries
use it, and the total. A response's bytes are its entry and the batches it appended to its list;
dropping it deletes its entry, and the list too once no entry of the tenant uses it (a chain's
older responses go first and their shared history stays while a newer one needs it). One script
after each save, only when a quota is set (`store_tenant_max_bytes`, `store_tenant_max_responses`);
Redis's `maxmemory` policy still bounds the store as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_FORGET = r"""
local function forget(rid)
  local rec = redis.call('HGET', KEYS[2], rid)
  redis.call('ZREM', KEYS[1], rid)
  if not rec then return end
  redis.call('HDEL', KEYS[2], rid)
  local size, list = string.match(rec, '^(%d+)\t(.*)$')
  redis.call('DECRBY', KEYS[5], size)
  if redis.call('HINCRBY', KEYS[3], list, -1) <= 0 then
    redis.call('HDEL', KEYS[3], list)
    local held = redis.call('HGET', KEYS[4], list)
    if held then
      redis.call('DECRBY', KEYS[5], held)
      redis.call('HDEL', KEYS[4], list)
    end
    redis.call('DEL', list)
  end
end
"""

ACCOUNT = (
    _FORGET
    + r"""
-- KEYS: ids by save time, id -> "bytes<TAB>list", list -> entries using it, list -> bytes, total.
-- ARGV: id, save time (ms), entry bytes, appended bytes, list, max responses (0: none), max bytes (0: none),
--       entry key prefix, ttl ms
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[2], id) == 1 then forget(id) end
redis.call('ZADD', KEYS[1], ARGV[2], id)
redis.call('HSET', KEYS[2], id, ARGV[3] .. '\t' .. ARGV[5])
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
redis.call('HINCRBY', KEYS[4], ARGV[5], ARGV[4])
redis.call('INCRBY', KEYS[5], tonumber(ARGV[3]) + tonumber(ARGV[4]))
local max_count, max_bytes, dropped = tonumber(ARGV[6]), tonumber(ARGV[7]), 0
while redis.call('ZCARD', KEYS[1]) > 1 do
  local over_count = max_count > 0 and redis.call('ZCARD', KEYS[1]) > max_count
  local over_bytes = max_bytes > 0 and tonumber(redis.call('GET', KEYS[5]) or '0') > max_bytes
  if not (over_count or over_bytes) then break end
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if oldest == id then break end
  forget(oldest)
  redis.call('DEL', ARGV[8] .. oldest)
  dropped = dropped + 1
end
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ARGV[9]) end
return dropped
"""
)

FORGET = _FORGET + "\nforget(ARGV[1])\nreturn 1\n"


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's share of the Redis store (0: no bound); `keys` names its bookkeeping."""

    max_responses: int = 0
    max_bytes: int = 0

    @property
    def on(self) -> bool:
        return bool(self.max_responses or self.max_bytes)

    @staticmethod
    def keys(prefix: str, tenant: str | None) -> list[str]:
        base = f"{prefix}tenant:{tenant or ''}:"
        return [base + name for name in ("ids", "sizes", "list_users", "list_bytes", "bytes")]

    def account_args(self, response_id: str, now_ms: int, entry: int, appended: int, history_key: str) -> list[Any]:
        return [response_id, now_ms, entry, appended, history_key, self.max_responses, self.max_bytes]


NO_QUOTA = TenantQuota()
