"""`chat.completions.create` over the session: `wrap(client)` (unless `chat_completions=False`).

The wrapped method translates the call (`chat_completions.py`), splits its messages against the
answered turns, and posts a prepared turn to `/chat/completions` through the SDK's own request
path, so retries, `with_raw_response` and the SDK's `ChatCompletion` / `Stream[ChatCompletionChunk]`
parsing are the SDK's. The transport runs the turn on the session and answers with chat JSON or
chat chunks (`chat_replies.py`); when the turn cannot ride the session it sends the call's own
chat body over HTTP. A call that cannot be translated faithfully goes to the SDK unchanged, and
`stats.chat_fallbacks` counts it under its reason.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from chat_mapping import ChunkStream

from . import _sdk
from .chaining import Plan
from .chat_completions import Untranslatable, translate_call
from .chat_replies import ChatReply
from .session import Session
from .turn import TurnRequest

log = logging.getLogger("ws_transport")

HTTP_ONLY = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
"""Arguments that shape the HTTP request rather than its body."""


def prepare_chat(session: Session, kwargs: dict[str, Any]) -> TurnRequest | None:
    """The turn for `chat.completions.create(**kwargs)`; None leaves the call to the SDK (and says why)."""
    if session.http_only:
        return None
    given = _sdk.given(kwargs)
    try:
        call = translate_call(given)
        plan = session.chat_book.plan(call)  # translates only the messages after the answered turn
    except Untranslatable as refused:
        fallbacks = session.stats.chat_fallbacks
        fallbacks[refused.reason] = fallbacks.get(refused.reason, 0) + 1
        log.debug("ws_transport: chat call over HTTP: %s", refused.reason)
        return None
    chain = plan.turn.link if plan.turn is not None else None
    body = {k: v for k, v in given.items() if k not in HTTP_ONLY}
    reply = ChatReply(
        plan, session.chat_book, lambda: orjson.dumps(_sdk.chat_body(body)), ChunkStream(call.include_usage)
    )
    session.stats.chat_turns += 1
    turn_plan = Plan(call.fields, plan.items, chain, plan.new_items)
    return TurnRequest(call.fields, turn_plan, plan.items, stream=call.stream, chat=reply)
