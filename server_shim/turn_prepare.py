"""A turn's first half: everything before inference, from the request to the `TurnPlan` the pipeline runs.

resolve the previous response -> validate and classify the new items -> run the checks due before
inference -> plan the tools -> extend the history and fit it to the context window. Raises `APIError`
and leaves all state untouched (a refused request changes nothing: the cache gets a state loaded from
the store only once the request is accepted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Set

from .callids import with_calls
from .checks import CheckOutcome, prepare_checks
from .compaction import expand_compactions
from .errors import model_not_found
from .history import History
from .items import Item, normalize_input, resolve_references, validate_items
from .limits import check_conversation_bytes, check_reference_bytes, is_large
from .requests import CreateRequest
from .safety import run_classifiers, run_validators
from .state import ConnectionCache, ResponseState
from .tools import plan_tools
from .truncation import fit_history
from .turn_plan import (
    RequestHeld,
    TurnEnv,
    TurnPlan,
    TurnResult,
    batch_held,
    cached_previous,
    request_held,
    resolve_previous,
    served_models,
    walked_tools,
)
from .turn_settings import Derived, SettingsMemo

NO_CALLS: frozenset[str] = frozenset()
"""The call ids a string input introduces."""


async def plan_turn(
    request: CreateRequest,
    env: TurnEnv,
    cache: ConnectionCache | None,
    tenant: str | None,
    result: TurnResult,
    memo: SettingsMemo | None = None,
) -> TurnPlan:
    """The prepared turn; its stages timed in `result.stages`, the plugins' seconds in `result.plugin_s`.
    `memo`: the connection's last derivation from the settings, reused while they stay the same (`turn_settings`)."""
    if not env.serves_model(request.model):
        raise model_not_found(request.model, await served_models(env.backend))
    stages = result.stages
    previous_id = request.previous_response_id
    previous = cached_previous(previous_id, cache)
    if previous is None and previous_id is not None:
        previous = await resolve_previous(previous_id, cache, env, tenant)
    stages.mark("resolve")
    raw = request.input
    new_items = normalize_input(raw)
    known_calls: Set[str] = previous.call_ids if previous else frozenset()
    introduced: Set[str] = NO_CALLS
    if raw.__class__ is not str:  # a string is one user message (`normalize_input`): no compaction, valid as it is
        new_items = expand_compactions(new_items, env.compaction_key, tenant, env.limits)
        introduced = validate_items(new_items, known_calls)
    large = is_large(len(new_items))
    if large:
        await asyncio.sleep(0)  # a large request gives way between its passes over the items
    labels = await _run_plugins(request, env, new_items, previous, result) if env.validators or env.classifiers else {}
    if not result.plugin_s:  # none configured: no time in either (no clock read for it)
        result.plugin_s = {"validator": 0.0, "classifier": 0.0}
    stages.mark("validate")
    expanded = resolve_references(new_items, previous.output_items if previous else [])
    if expanded is not new_items:
        check_reference_bytes(new_items, expanded, env.limits)
        new_items = expanded
    prior_checks = previous.checks if previous else {}
    prior_output = previous.output_items if previous else []
    model_checks = env.checks(request.model)
    if model_checks:
        checked = stages.clock()
        outcome, later = await prepare_checks(
            model_checks, prior_checks, prior_output, new_items, overlap=env.overlap_checks
        )
        result.plugin_s["check"] = stages.clock() - checked
    else:  # what `prepare_checks` makes of no checks, in no time
        outcome, later = CheckOutcome({}, {}, list(new_items)), []
        result.plugin_s["check"] = 0.0
    new_items = outcome.items
    sticky = previous.deployment if previous else None
    notices = cache.notices if cache is not None else set()
    tools = plan_tools(request, previous, env.hosted_policy, sticky, labels, notices)
    base = previous.history if previous else History()
    result.new_items = len(new_items)
    batch = tuple(new_items)
    history = base.extend(batch, await batch_held(batch) if large else None)
    check_conversation_bytes(history.items_held, env.limits)  # the items, whichever backend renders them
    if large:
        await asyncio.sleep(0)
    sent = fit_history(history, env.context_window(request.model, sticky), request, tools.backend)
    derived = memo.derived(request) if memo is not None else Derived(request)
    tools_walked = walked_tools(request, previous)
    plan = TurnPlan(  # every field by position, in order (see `TurnPlan`)
        new_items,
        tools.chat,  # tools
        tools.sent,  # chat_tools
        history,
        sent,  # sent_history
        with_calls(known_calls, introduced) if introduced else known_calls,  # call_ids
        len(base) if sent is history else 0,  # previous_items
        previous.deployment if previous else None,  # deployment
        previous.carry if previous and sent is history else {},  # carry
        labels | outcome.labels if outcome.labels else labels,  # labels (the turn's own dict: none but checks' found)
        tools.backend,  # backend_tools
        base.held,  # base_held
        derived,
        derived.echo(request),  # echoed
        (  # held
            await request_held(tools_walked, derived)
            if tools_walked or derived.echo_held is None
            else RequestHeld(None, derived.echo_held)
        ),
        outcome,  # checks
        prior_checks,
        prior_output,
        later,  # later_checks
        previous,
    )
    if previous is not None and cache is not None and previous.id not in cache:
        cache.put(previous)  # loaded from the store: cached only once the request is accepted
    stages.mark("render")
    return plan


async def _run_plugins(
    request: CreateRequest, env: TurnEnv, new_items: list[Item], previous: ResponseState | None, result: TurnResult
) -> dict[str, str]:
    """The validators, then the classifiers' labels; the seconds of each kind in `result.plugin_s`."""
    clock = result.stages.clock
    started = clock()
    if env.validators:
        await run_validators(env.validators, new_items, previous, request)
    validated = clock()
    labels = await run_classifiers(env.classifiers, new_items) if env.classifiers else {}
    result.plugin_s = {"validator": validated - started, "classifier": clock() - validated}
    return labels
