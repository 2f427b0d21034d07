"""The server's hooks: backend kinds, validators, classifiers and post-inference sinks.

These live in the server so that it can load its plugins without the `plugins` package (the
integrations layer, which imports the server, never the other way round). `plugins/hookspecs.py`
re-exports them next to the client-side hooks: that is the one place a plugin author reads.

How the server calls each hook is stated on the hook; in short:
- every server hook is called once, when `create_app()` builds the server, never per turn;
  what they return (factories, validators, classifiers) is what runs per turn;
- pluggy calls implementations last-registered first (entry-point plugins after the built-in
  ones), and `tryfirst` / `trylast` on `@hookimpl` reorder them as pluggy documents;
- a hook that raises at start-up stops `create_app()` with that error: a broken plugin is found
  when the server starts, not on the first request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .backends.base import BackendFactory
    from .checks import Check
    from .postinference import TurnInfo
    from .safety import Classifier, Validator
    from .settings import Settings

PROJECT = "responses_ws"
"""The pluggy project name, which is also the entry-point group plugins register under."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def responses_ws_backend_kinds() -> dict[str, BackendFactory]:
    """Backend kinds this plugin provides, as `{kind: factory}`; sync; called once at start-up.

    A deployment in the config file selects a kind by name (`kind = "my_kind"`). The factory is
    called once per deployment of that kind, when the server starts, as

        factory(deployment, **deployment.options) -> Backend

    `deployment` is the `server_shim.DeploymentConfig` (name, base_url, `resolved_api_key()`,
    models, timeout_s, ...) and the keyword arguments are the deployment's `[deployments.options]`
    table, so a factory declares the settings it accepts as keyword parameters and an unknown one
    fails at start-up with the deployment's name. It returns an object implementing
    `server_shim.Backend`; exceptions propagate and stop the server from starting.

    Who wins on a duplicate kind: the implementation pluggy calls first, that is the
    later-registered plugin (an entry-point plugin over the built-in kinds, so a plugin may replace
    `openai_compatible`), unless `tryfirst`/`trylast` say otherwise. Each replacement is logged.
    """


@hookspec
def responses_ws_validators(settings: Settings) -> list[Validator]:
    """Validators for new input items; this hook is sync and called once at start-up.

    Each validator is called per turn, before inference, as `validator(new_items, previous, request)`:
    the items that arrived on this turn (after normalisation, before `item_reference`s are resolved),
    the previous `ResponseState` or None (read-only), and the `CreateRequest`. A validator may be a
    plain function or an `async def` (or return any awaitable): it is always awaited before the
    turn goes on. It refuses the turn by raising `server_shim.APIError`, which the client receives
    as an `error` event (HTTP: the status); the connection and its cache are unchanged afterwards.
    Any other exception fails the turn as a `server_error` (fail closed: a crashing validator never
    lets a turn through). Order: validators passed to `create_app(validators=...)` first, then the
    plugins' in pluggy's call order; the first to raise stops the turn. Keep them fast: they run on
    the event loop on every turn, before the response is created.
    """


@hookspec
def responses_ws_classifiers(settings: Settings) -> list[Classifier]:
    """Classifiers for new input items; this hook is sync and called once at start-up.

    Each classifier is called per turn after the validators, as `classifier(new_items)`, may be sync
    or `async def` (always awaited), and returns labels (`{str: str}`) that the server adds to the
    response's `metadata` under `classifier.<name>`. On a duplicate name the classifier called later
    wins (order as for validators). Like validators they see only what is new and fail closed: an
    exception, or a result that is not `{str: str}`, fails the turn as a `server_error`.
    """


@hookspec
def responses_ws_checks(settings: Settings) -> list[Check]:
    """Stateful incremental checks (`server_shim.checks.Check`); this hook is sync, called once at start-up.

    They run on every turn for every model, after the checks passed to `create_app(checks=...)` and
    before the config file's built-in ones. Each keeps a per-conversation state (a JSON value,
    stored with each response, never changed in place) that it updates from the new items only:
    `inspect(state, input_run)` (sync or async) returns `(new_state, Finding)` with labels
    (`metadata["check.<key>"]`), a refusal (`APIError`) or, for a check with `mutates = True`, the
    rewritten items; `observe(state, output_run)` folds the model's output. Checks that do not
    mutate run beside inference; `blocking` ones hold the client's first token until they pass.
    An exception other than `APIError` fails the turn with `server_error`. Names must be unique.
    """


@hookspec
def responses_ws_response_finished(response: dict[str, Any], transport: str, info: TurnInfo) -> Awaitable[None] | None:
    """Post-inference work (usage, billing, audit), called once per finished response.

    `response` is the final response object (completed, incomplete or failed) and `transport` is
    "websocket" or "http"; `info` (`server_shim.postinference.TurnInfo`) adds the tenant id,
    connection id, deployment, time to first token and duration. Declare only the arguments you
    use. `response` is read-only: the state cache and the store keep the same object, and the
    settings it echoes (`text`, `tools`, `metadata`...) are shared with the tenant's other responses
    made with the same settings (copy it to change it). Called in a background task as the client gets the terminal event, so it overlaps the
    client's next request instead of delaying it; the server drains pending calls at shutdown.
    The built-in usage ledger needs no hook: it records every response durably on its own. May be sync or `async def`. Each plugin's implementation runs on its own:
    an exception is logged with the plugin's name and stops no other sink; nothing reaches the client.
    An implementation may carry a `listening` attribute, a function of no arguments: while it returns
    false the implementation is not called (the built-in usage log sets it to "DEBUG is on"), and a
    turn no implementation listens to schedules no work at all.
    """
