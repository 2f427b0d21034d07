"""`responses-ws usage`: totals per tenant and model from the usage ledger, as a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson

from .ledger import UsageRecord

SUM_FIELDS = ("input_tokens", "cached_tokens", "output_tokens")
RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """`90m`, `24h`, `7d` (ago) or an ISO 8601 date/time; a Unix timestamp in seconds."""
    relative = RELATIVE.fullmatch(text.strip())
    if relative:
        return (now if now is not None else time.time()) - float(relative[1]) * UNIT_S[relative[2]]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since {text!r}: use 90m, 24h, 7d or an ISO date such as 2026-12-01T00:00") from None
    return moment.timestamp()


def totals(records: Iterable[UsageRecord]) -> list[dict[str, Any]]:
    """One row per (tenant, model): response count, failed count, how many of them have estimated token
    counts (`UsageRecord.estimated`), token sums, mean time to first token."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    ttfts: dict[tuple[str, str], list[float]] = {}
    for record in records:
        key = (record.tenant or "-", record.model)
        row = rows.setdefault(
            key,
            {"tenant": key[0], "model": key[1], "responses": 0, "failed": 0, "estimated": 0}
            | dict.fromkeys(SUM_FIELDS, 0),
        )
        row["responses"] += 1
        row["failed"] += record.status == "failed"
        row["estimated"] += record.estimated
        for name in SUM_FIELDS:
            row[name] += getattr(record, name)
        if record.ttft_ms is not None:
            ttfts.setdefault(key, []).append(record.ttft_ms)
    for key, row in rows.items():
        values = ttfts.get(key)
        row["mean_ttft_ms"] = round(sum(values) / len(values), 1) if values else None
    return [rows[key] for key in sorted(rows)]


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
    names = ["tenant", "model", "responses", "failed", "estimated", *SUM_FIELDS, "mean_ttft_ms"]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    table = [names, *[["" if row[n] is None else str(row[n]) for n in names] for row in rows]]
    widths = [max(len(line[i]) for line in table) for i in range(len(names))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table)
