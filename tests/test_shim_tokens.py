"""Token accounting: counted incrementally, with the backend's own tokenizer where it has one.

The end-to-end test runs llama-cpp-python's server (which sends no usage when streaming) behind
the shim with `tokenizer = "llama-cpp-python"` and checks each turn's `input_tokens` and
`cached_tokens` against the server's tokenizer applied to every message of the conversation.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from server_shim import BackgroundServer, ShimConfig, create_app
from server_shim.backends.base import Usage
from server_shim.tokens import Counted, EstimateCounter, account, message_text, turn_tokens


class WordCounter:
    """A tokenizer stand-in (one token per word) that records what it was asked to count."""

    name = "words"
    exact = True

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def count(self, messages: Sequence[dict[str, Any]]) -> int:
        self.asked.append(len(messages))
        return sum(len(message_text(m).split()) for m in messages)


def said(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


async def test_a_chained_turn_counts_only_the_previous_output_and_its_new_input():
    counter = WordCounter()
    first = await turn_tokens(counter, None, list, (), [said("user", "one two three")], None)
    assert (first.input_tokens, first.cached_tokens, first.through) == (3, 0, ("words", 3))
    second = await turn_tokens(
        counter,
        first.through,
        lambda: pytest.fail("the prefix is never recounted"),
        [said("assistant", "four five")],
        [said("user", "six")],
        "be brief",
    )
    assert (second.input_tokens, second.cached_tokens, second.through) == (3 + 2 + 1 + 2, 5, ("words", 6))
    assert counter.asked == [1, 1, 1, 1], "only the new messages (and the instructions) were counted"


async def test_without_a_count_of_the_same_tokenizer_the_prefix_is_counted_once():
    counter = WordCounter()
    history = [said("user", "a b"), said("assistant", "c")]
    counted = await turn_tokens(counter, ("estimate", 99), lambda: history, [history[1]], [said("user", "d")], None)
    assert (counted.input_tokens, counted.cached_tokens) == (4, 3)


def test_counted_figures_replace_an_estimate_and_fill_missing_cached_tokens_only():
    counted = Counted(input_tokens=40, cached_tokens=30, through=("words", 40))
    assert account(Usage(10, 5, 0, estimated=True), counted) == Usage(40, 5, 30)
    assert account(Usage(50, 5, 0), counted) == Usage(50, 5, 30), "the backend's real input count stands"
    assert account(Usage(50, 5, 20), counted) == Usage(50, 5, 20)


async def test_the_estimate_is_a_quarter_of_the_json_bytes():
    message = said("user", "x" * 100)
    assert await EstimateCounter().count([message]) == len('{"role":"user","content":"' + "x" * 100 + '"}') // 4


needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python missing")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from benchmarks.llama_server import LlamaServer
    from benchmarks.tiny_model import write_tiny_model

    root = tmp_path_factory.mktemp("llama-tokens")
    with LlamaServer(write_tiny_model(root / "tiny.gguf"), root / "server.log") as server:
        yield server


def tokens(llama: Any, text: str) -> int:
    """The server's own count of `text`, less the BOS it prepends to every text."""
    url = llama.base_url.removesuffix("/v1") + "/extras/tokenize"
    count = len(httpx2.post(url, json={"input": text}, timeout=10).json()["tokens"])
    return count - len(httpx2.post(url, json={"input": ""}, timeout=10).json()["tokens"])


@needs_llama
async def test_usage_is_counted_with_llama_cpp_tokenizer_turn_by_turn(llama: Any, tmp_path: Path):
    alias = llama.alias
    config = ShimConfig.model_validate(
        {
            "server": {"usage_ledger": "off"},
            "deployments": [
                {
                    "name": "llama",
                    "kind": "openai_compatible",
                    "base_url": llama.base_url,
                    "models": {alias: alias},
                    "quirks": {"stream_usage": False},
                    "tokenizer": "llama-cpp-python",
                }
            ],
        }
    )
    texts = ["Say something.", "And something else, please.", "One more time."]
    with BackgroundServer(create_app(config=config), config.settings()) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            previous, history_tokens = None, 0
            for text in texts:
                await conn.response.create(
                    model=alias, input=text, previous_response_id=previous, max_output_tokens=8, temperature=0
                )
                async for event in conn:
                    if event.type in ("response.completed", "response.incomplete", "error"):
                        break
                assert event.type != "error", event
                usage = event.response.usage
                assert usage.input_tokens == history_tokens + tokens(llama, text)
                assert usage.input_tokens_details.cached_tokens == history_tokens
                history_tokens = usage.input_tokens + tokens(llama, event.response.output_text)
                previous = event.response.id
            counted = await client.responses.input_tokens.count(model=alias, input=texts[0])
            assert counted.input_tokens == tokens(llama, texts[0]), "the input_tokens route uses the tokenizer too"
