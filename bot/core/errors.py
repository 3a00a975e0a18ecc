"""Tandem's error tree.

TandemError
├── ConfigError            bad config or missing secret (the CLI prints one line, exits 2)
├── ContextOverflowError   the system prompt alone does not fit the context window
├── ModelError             the model could not be reached or refused the request
│   ├── ModelRateLimited   still rate limited after retries
│   ├── ModelUnreachable   failed after retries: why, and where (shown in one line)
│   ├── ModelStreamCut     the model's answer stopped mid-way (after retries)
│   └── TurnTooLong        this turn alone no longer fits the context window
├── ToolError              a tool refused or failed (its text goes to the model, not the user)
│   └── PathRefused        a path outside the workspace or a protected file
└── StoreError             the database is unusable
    ├── StoreUnusable      store.path cannot be the database (a config problem)
    └── StoreConflict      another process wrote the same thing first (not unusable)

Users only ever see the fixed texts in `USER_MESSAGES` (a `{cause}` in one is filled from
the exception's fixed `cause`); details go to the logs.
"""

from __future__ import annotations


class TandemError(Exception):
    """Root of every error Tandem raises on purpose."""


class ConfigError(TandemError):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config: {key}: {problem}")
        self.key = key
        self.problem = problem


class ContextOverflowError(TandemError):
    pass


class ModelError(TandemError):
    pass


class ModelRateLimited(ModelError):
    pass


class ModelUnreachable(ModelError):
    """The model call failed after retries. `cause` is a short fixed phrase ("connection
    refused", "the API key was refused (401)"…) and `where` the endpoint without
    credentials: users and `tandem doctor` see both."""

    def __init__(self, message: str, cause: str, where: str) -> None:
        super().__init__(message)
        self.cause, self.where = cause, where


class ModelStreamCut(ModelError):
    """The model answered, but its stream stopped before the end (connection lost, timed
    out...). `cause` is one of a few fixed, short phrases: users see it."""

    def __init__(self, message: str, cause: str = "the connection was lost") -> None:
        super().__init__(message)
        self.cause = cause


class TurnTooLong(ModelError):
    """Even without older turns, this turn does not fit the model's context window."""


class ToolError(TandemError):
    pass


class PathRefused(ToolError):
    pass


class StoreError(TandemError):
    pass


class StoreUnusable(StoreError):
    """`store.path` names something that cannot be the database: a configuration
    problem, told in one line."""


class StoreConflict(StoreError):
    """A write lost to another process's (a unique key taken, a serialization failure, a
    deadlock): the database works, and the same request may well succeed again."""


USER_MESSAGES: dict[type[TandemError], str] = {
    ContextOverflowError: "The system prompt is larger than the model's context window; "
    "an admin needs to shorten the persona files or raise llm.context_window.",
    ModelRateLimited: "The model is rate limited right now. Please try again in a minute.",
    ModelStreamCut: "The model's answer was cut off mid-way ({cause}); please try again.",
    TurnTooLong: "This turn no longer fits the model's context window, even without older "
    "messages. Send /new to start afresh.",
    ModelUnreachable: "The model call failed: {cause} ({where}). Please try again in a "
    "moment.",
    ModelError: "The model could not be reached. Please try again in a moment.",
    StoreConflict: "Another Tandem process changed this conversation at the same moment, "
    "so this was not done. Please send it again.",
    StoreError: "Tandem's database is unavailable. Please try again shortly.",
}


def user_message(exc: BaseException) -> str:
    """The fixed, friendly text a user sees for an error (never the exception text)."""
    for cls in type(exc).__mro__:
        if cls in USER_MESSAGES:
            text = USER_MESSAGES[cls]  # type: ignore[index]
            return text.replace("{cause}", str(getattr(exc, "cause", ""))) \
                .replace("{where}", str(getattr(exc, "where", "")))
    return "Something went wrong on Tandem's side. The details are in the logs."
