"""Shared fixtures: real uvicorn servers on free loopback ports and the official `openai` clients."""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from support.wire import API_KEY

from server_shim import BackgroundServer, Settings, create_app
from server_shim.logs import QUIET_LOGGERS
from server_shim.requests import CreateRequest
from server_shim.state import ResponseState


@dataclass
class ValidatorCall:
    items: list[dict[str, Any]]
    previous_id: str | None
    request: CreateRequest


class RecordingValidator:
    """A pipeline validator that records exactly the new items each turn delivered to the server."""

    def __init__(self) -> None:
        self.calls: list[ValidatorCall] = []

    def __call__(self, new_items: list[dict[str, Any]], previous: ResponseState | None, request: CreateRequest) -> None:
        self.calls.append(ValidatorCall(copy.deepcopy(new_items), previous.id if previous else None, request))

    @property
    def last(self) -> ValidatorCall:
        return self.calls[-1]


FRAMEWORK_TESTS_ENV = "RESPONSES_WS_FRAMEWORK_TESTS"
# tests/frameworks/ needs frameworks that pin openai<3: .ci/run runs it in a venv of its own with this
# variable set; in the main venv it is not collected at all (so never counted as passed or skipped).
collect_ignore = [] if os.environ.get(FRAMEWORK_TESTS_ENV) else ["frameworks"]

# serve_process: `responses-ws serve` as a subprocess; chain_report: turns chained per framework test
pytest_plugins = ["support.serve", "support.chain_report"]

ServerFactory = Callable[..., BackgroundServer]

# The usage ledger's default file lives under $XDG_STATE_HOME: the tests (and the servers they start) keep theirs
# in a temporary directory, never in the home directory.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="responses-ws-tests-state-")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs the CLI in-process (`main([...])`) configures logging for the whole process: a
    root handler on the stderr pytest captured for that test, and level INFO. Put back afterwards, so
    later tests' servers neither write to a closed capture file nor keep INFO records in pytest's
    log capture (which a memory test would count as held)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quiet = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in quiet.items():
        logging.getLogger(name).setLevel(was)


@pytest.fixture
def recorder() -> RecordingValidator:
    return RecordingValidator()


@pytest.fixture(scope="session")
def _stopping_servers() -> Iterator[list[BackgroundServer]]:
    """Servers told to exit; joined once at the end so no test waits for uvicorn's shutdown ticks."""
    stopping: list[BackgroundServer] = []
    yield stopping
    for server in stopping:
        server.stop()


@pytest.fixture
def make_server(_stopping_servers: list[BackgroundServer], tmp_path_factory: Any) -> Iterator[ServerFactory]:
    """Start a shim server with these `Settings` overrides (`backend_impl`: a `Backend`, `store_impl`: a store).

    Every server is told to stop at teardown.
    """
    started: list[BackgroundServer] = []

    def make(
        *, validators: Any = (), backend_impl: Any = None, store_impl: Any = None, config: Any = None, **overrides: Any
    ) -> BackgroundServer:
        overrides.setdefault("drain_timeout_s", 2.0)
        overrides.setdefault("usage_path", str(tmp_path_factory.mktemp("usage") / "usage.db"))
        settings = Settings(**overrides)
        app = create_app(settings, config=config, backend=backend_impl, store=store_impl, validators=list(validators))
        server = BackgroundServer(app, settings).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.server.should_exit = True
    _stopping_servers.extend(started)


@pytest.fixture
def server(make_server: ServerFactory, recorder: RecordingValidator) -> BackgroundServer:
    """The shim on the simulated backend, with a recording validator."""
    return make_server(validators=[recorder])


@pytest.fixture
async def client(server: BackgroundServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def sync_client(server: BackgroundServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def chat_server() -> Iterator[Any]:
    from support.chat_server import ChatServer

    with ChatServer() as chat:
        yield chat


@pytest.fixture(scope="session")
def _redis_server() -> Iterator[Any]:
    from benchmarks.redis_server import RedisServer

    with RedisServer() as redis_server:
        yield redis_server


@pytest.fixture
def redis_server(_redis_server: Any) -> Any:
    """A real redis-server shared by the session, emptied for each test (restarted if a test stopped it)."""
    if not _redis_server.ping():
        _redis_server.start()
    _redis_server.command("FLUSHALL")
    return _redis_server
