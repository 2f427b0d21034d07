"""Built-in checks: a content policy (word lists, patterns), secrets/PII detection, a model-backed guard.

Both are stateful incremental checks (`checks.py`): they read only the new input of a turn, keep
per-conversation counts in their state, and label the response `check.<name>`. Their text is
every string a person or tool put into an input item: message text, tool outputs, call arguments.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .backends.base import Backend, BackendRequest, TextDelta
from .checks import Finding
from .errors import APIError
from .history import History
from .items import Item

Action = Literal["flag", "block", "redact"]
TEXT_KEYS = ("content", "text", "output", "arguments", "input")


def item_texts(item: Item) -> list[str]:
    """The strings of an item that carry what someone wrote (nested parts included)."""
    found: list[str] = []
    _collect(item, found)
    return found


def _collect(value: Any, found: list[str]) -> None:
    if isinstance(value, dict):
        for key in TEXT_KEYS:
            inner = value.get(key)
            if isinstance(inner, str):
                found.append(inner)
            elif isinstance(inner, list):
                for part in inner:
                    _collect(part, found)


def map_texts(item: Item, rewrite: Callable[[str], str]) -> Item:
    """A copy of `item` with `rewrite` applied to each of its texts; the original is left as it was."""
    copy = dict(item)
    for key in TEXT_KEYS:
        inner = copy.get(key)
        if isinstance(inner, str):
            copy[key] = rewrite(inner)
        elif isinstance(inner, list):
            copy[key] = [map_texts(part, rewrite) if isinstance(part, dict) else part for part in inner]
    return copy


class ContentPolicy:
    """Refuses or flags input that matches a word list (whole words, any case) or a regex pattern.

    State: `{"hits": matches so far, "flagged": input runs that matched}`; labels `check.<name>`
    (`flagged` or `clean`) and `check.<name>.flagged` (the conversation's count so far).
    """

    mutates = False

    def __init__(
        self,
        name: str = "content_policy",
        *,
        words: Sequence[str] = (),
        patterns: Sequence[str] = (),
        action: Action = "block",
        code: str = "content_policy_violation",
    ) -> None:
        if action not in ("flag", "block"):
            raise ValueError(f"check {name!r}: a content policy can 'flag' or 'block', not {action!r}")
        alternatives = [rf"\b{re.escape(word)}\b" for word in words] + [f"(?:{p})" for p in patterns]
        if not alternatives:
            raise ValueError(f"check {name!r}: give words or patterns")
        self.name = name
        self.blocking = action == "block"
        self.code = code
        self._pattern = re.compile("|".join(alternatives), re.IGNORECASE)

    def initial(self) -> dict[str, int]:
        return {"hits": 0, "flagged": 0}

    def observe(self, state: dict[str, int], items: list[Item]) -> dict[str, int]:
        return state

    def inspect(self, state: dict[str, int], items: list[Item]) -> tuple[dict[str, int], Finding]:
        hits = sum(len(self._pattern.findall(text)) for item in items for text in item_texts(item))
        state = {"hits": state["hits"] + hits, "flagged": state["flagged"] + (hits > 0)}
        labels = {self.name: "flagged" if hits else "clean", f"{self.name}.flagged": str(state["flagged"])}
        refusal = None
        if hits and self.blocking:
            refusal = APIError(400, self.code, f"The input violates this server's content policy ({self.name}).")
        return state, Finding(labels=labels, refusal=refusal)


API_KEY = (
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|-----BEGIN [A-Z ]*PRIVATE KEY-----)"
)
DETECTORS: dict[str, re.Pattern[str]] = {
    "api_key": re.compile(API_KEY),
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
    "card_number": re.compile(r"\b\d(?:[ -]?\d){12,18}\b"),
}
"""What `Secrets` looks for. Card numbers must also pass the Luhn check, so most long numbers do not count."""


def luhn_ok(candidate: str) -> bool:
    digits = [int(c) for c in candidate if c.isdigit()]
    total = 0
    for index, digit in enumerate(reversed(digits)):
        if index % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


class Secrets:
    """Finds API-key shapes, email addresses and card numbers in new input; flag, block or redact.

    `redact` replaces each finding with `[REDACTED:<kind>]` before inference: the backend, the
    stored items and later turns only ever see the redacted text. State: counts per kind so far;
    labels `check.<name>` (the kinds found in this turn, comma-separated, or `none`).
    """

    def __init__(
        self,
        name: str = "secrets",
        *,
        detect: Sequence[str] = tuple(DETECTORS),
        action: Action = "redact",
        code: str = "sensitive_data_detected",
    ) -> None:
        unknown = set(detect) - set(DETECTORS)
        if unknown:
            raise ValueError(f"check {name!r}: unknown detectors {sorted(unknown)}; known: {sorted(DETECTORS)}")
        self.name = name
        self.action = action
        self.mutates = action == "redact"
        self.blocking = action == "block"
        self.code = code
        self._detectors = {kind: DETECTORS[kind] for kind in detect}

    def initial(self) -> dict[str, int]:
        return dict.fromkeys(self._detectors, 0)

    def observe(self, state: dict[str, int], items: list[Item]) -> dict[str, int]:
        return state

    def inspect(self, state: dict[str, int], items: list[Item]) -> tuple[dict[str, int], Finding]:
        found = dict.fromkeys(self._detectors, 0)
        for item in items:
            for text in item_texts(item):
                for kind in self._detectors:
                    found[kind] += len(self._matches(kind, text))
        state = {kind: state.get(kind, 0) + count for kind, count in found.items()}
        kinds = [kind for kind, count in found.items() if count]
        finding = Finding(labels={self.name: ",".join(kinds) or "none"})
        if kinds and self.action == "block":
            message = f"The input contains {', '.join(k.replace('_', ' ') for k in kinds)} ({self.name})."
            finding = Finding(labels=finding.labels, refusal=APIError(400, self.code, message))
        elif kinds and self.action == "redact":
            finding = Finding(labels=finding.labels, items=[map_texts(item, self.redact) for item in items])
        return state, finding

    def redact(self, text: str) -> str:
        for kind in self._detectors:
            for match in reversed(self._matches(kind, text)):
                text = text[: match.start()] + f"[REDACTED:{kind}]" + text[match.end() :]
        return text

    def _matches(self, kind: str, text: str) -> list[re.Match[str]]:
        matches = list(self._detectors[kind].finditer(text))
        return [m for m in matches if luhn_ok(m.group())] if kind == "card_number" else matches


class Guard:
    """A model-backed guard: sends only the new input to a guard model and keeps its verdicts.

    `model` is a model alias this server routes (a deployment running e.g. Llama Guard on any
    OpenAI-compatible server, or a simulated deployment in guard mode). The guard is asked once per
    turn with the new input items as one user message (`role: text` lines) and must answer as Llama
    Guard does: `safe`, or `unsafe` and a line of comma-separated categories. State: the number of
    unsafe input runs and the categories seen so far, so a long conversation is never sent in full.
    A guard that cannot be reached fails the turn closed (`server_error`).
    """

    mutates = False

    def __init__(
        self,
        name: str = "guard",
        *,
        backend: Backend,
        model: str,
        action: Action = "block",
        code: str = "content_policy_violation",
    ) -> None:
        if action not in ("flag", "block"):
            raise ValueError(f"check {name!r}: a guard can 'flag' or 'block', not {action!r}")
        self.name = name
        self.backend = backend
        self.model = model
        self.blocking = action == "block"
        self.code = code

    def initial(self) -> dict[str, Any]:
        return {"unsafe": 0, "categories": []}

    def observe(self, state: dict[str, Any], items: list[Item]) -> dict[str, Any]:
        return state

    async def inspect(self, state: dict[str, Any], items: list[Item]) -> tuple[dict[str, Any], Finding]:
        unsafe, categories = parse_guard_reply(await self._ask(items))
        state = {
            "unsafe": state["unsafe"] + unsafe,
            "categories": sorted(set(state["categories"]) | set(categories)),
        }
        labels = {self.name: "unsafe" if unsafe else "safe", f"{self.name}.categories": ",".join(categories)}
        refusal = None
        if unsafe and self.blocking:
            refusal = APIError(400, self.code, f"The guard model found the input unsafe ({','.join(categories)}).")
        return state, Finding(labels=labels, refusal=refusal)

    async def _ask(self, items: list[Item]) -> str:
        transcript = "\n".join(
            f"{item.get('role', item.get('type'))}: {text}" for item in items for text in item_texts(item)
        )
        request = BackendRequest(
            model=self.model,
            history=History().extend([{"type": "message", "role": "user", "content": transcript}]),
            max_output_tokens=16,
        )
        reply: list[str] = []
        async with contextlib.aclosing(self.backend.stream(request)) as deltas:
            async for delta in deltas:
                if isinstance(delta, TextDelta):
                    reply.append(delta.text)
        return "".join(reply)


def parse_guard_reply(reply: str) -> tuple[bool, list[str]]:
    """Llama Guard's answer: `safe`, or `unsafe` then a line of categories (`S1,S10`)."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    if not lines or not lines[0].lower().startswith("unsafe"):
        return False, []
    categories = lines[1] if len(lines) > 1 else ""
    return True, [c.strip() for c in categories.split(",") if c.strip()]
