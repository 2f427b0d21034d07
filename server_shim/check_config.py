"""Built-in checks in the config file: `[[checks]]` for every model, `[[deployments.checks]]` per deployment.

A deployment's checks apply to the requests for the model aliases it serves (all of them for a
`*` deployment), in addition to the top-level ones. Checks are keyed by name (default: the kind);
two different checks of one name on the same alias are a config error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from .backends.base import Backend
    from .checks import Check
    from .config import ShimConfig


class CheckConfig(BaseModel):
    """One built-in check (`server_shim/policies.py`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["content_policy", "secrets", "guard"]
    name: str | None = Field(default=None, description="label and state key; default: the kind")
    action: Literal["flag", "block", "redact"] = Field(
        default="block", description="flag (label only), block (refuse), redact (secrets only: rewrite the input)"
    )
    code: str | None = Field(default=None, description="error code of a refusal")
    words: list[str] = Field(default_factory=list, description="content_policy: whole words, any case")
    words_file: str | None = Field(default=None, description="content_policy: a word list file, one a line")
    patterns: list[str] = Field(default_factory=list, description="content_policy: regular expressions")
    detect: list[str] = Field(
        default_factory=lambda: ["api_key", "email", "card_number"], description="secrets: what to look for"
    )
    model: str | None = Field(default=None, description="guard: the model alias of the guard deployment")

    @model_validator(mode="after")
    def _fits_kind(self) -> CheckConfig:
        if self.action == "redact" and self.kind != "secrets":
            raise ValueError(f"check {self.key!r}: only a 'secrets' check can redact")
        if self.kind == "guard" and not self.model:
            raise ValueError(f"check {self.key!r}: a guard needs the model alias of its guard deployment")
        if self.kind == "content_policy" and not (self.words or self.words_file or self.patterns):
            raise ValueError(f"check {self.key!r}: give words, words_file or patterns")
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"check {self.key!r}: pattern {pattern!r} is not a regular expression: {exc}"
                ) from None
        if self.words_file is not None and not Path(self.words_file).is_file():
            raise ValueError(f"check {self.key!r}: words_file {self.words_file!r} is not a readable file")
        return self

    @property
    def key(self) -> str:
        return self.name or self.kind

    def build(self, backend: Backend) -> Check:
        from . import policies

        code = {"code": self.code} if self.code else {}
        if self.kind == "content_policy":
            words = [*self.words, *_read_words(self.words_file)]
            return policies.ContentPolicy(self.key, words=words, patterns=self.patterns, action=self.action, **code)
        if self.kind == "secrets":
            return policies.Secrets(self.key, detect=self.detect, action=self.action, **code)
        assert self.model is not None
        return policies.Guard(self.key, backend=backend, model=self.model, action=self.action, **code)


def _read_words(path: str | None) -> list[str]:
    if path is None:
        return []
    lines = Path(path).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def checks_by_model(config: ShimConfig, backend: Backend) -> Callable[[str], Sequence[Check]]:
    """The checks for each model alias, built once: the top-level ones, then each serving deployment's."""
    built: dict[str, Check] = {}

    def instance(check: CheckConfig) -> Check:
        if check.key not in built:
            built[check.key] = check.build(backend)
        return built[check.key]

    configs: dict[str, CheckConfig] = {}
    for check in [*config.checks, *(c for d in config.deployments for c in d.checks)]:
        if configs.setdefault(check.key, check) != check:
            raise ValueError(f"two different checks are named {check.key!r}; give each its own name")
    everywhere = [instance(check) for check in config.checks]
    wildcard = [instance(c) for d in config.deployments if "*" in d.models for c in d.checks]
    per_alias: dict[str, list[Check]] = {}
    for deployment in config.deployments:
        for alias in deployment.models:
            per_alias.setdefault(alias, []).extend(instance(c) for c in deployment.checks)
    table = {alias: _unique([*everywhere, *wildcard, *extra]) for alias, extra in per_alias.items()}
    default = _unique([*everywhere, *wildcard])
    return lambda model: table.get(model, default)


def _unique(checks: list[Check]) -> list[Check]:
    return list({check.name: check for check in checks}.values())
