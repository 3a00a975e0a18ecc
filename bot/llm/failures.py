"""Why a model call failed, in a few fixed words a user and an admin can act on.

litellm wraps the provider's error (and that the HTTP library's) several layers deep;
the cause is found anywhere in the chain. The endpoint is named without credentials.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def chain(exc: BaseException) -> list[BaseException]:
    """The exception, its causes and what litellm wrapped (`original_exception`)."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(out) < 20:
        item = todo.pop()
        if item is None or any(item is seen for seen in out):
            continue
        out.append(item)
        original = getattr(item, "original_exception", None)
        todo += [item.__cause__, item.__context__,
                 original if isinstance(original, BaseException) else None]
    return out


def endpoint(api_base: str | None, model: str) -> str:
    """Where the call went: `llm.api_base` without user, password or query, else the
    model's provider."""
    if not api_base:
        return f"{model.split('/', 1)[0]}'s API"
    parts = urlsplit(api_base)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")) or "llm.api_base"


_NO_HOST = ("name or service not known", "nodename nor servname", "getaddrinfo failed",
            "temporary failure in name resolution", "no address associated")


def cause(exc: BaseException, timeout_s: float) -> str:
    """A short, fixed phrase for why the call failed."""
    links = chain(exc)
    names = " ".join(type(e).__name__ for e in links)
    text = " ".join(str(e) for e in links).lower()
    status = next((s for e in links if isinstance(s := getattr(e, "status_code", None), int)),
                  None)
    if "repeating chunk" in text or "repeated the same chunk" in text:
        return "the model kept sending the same chunk (stopped by litellm's loop guard)"
    if "Timeout" in names or "TimedOut" in names:
        return f"no answer within {timeout_s:g} s"
    if status == 401 or "AuthenticationError" in names:
        return "the API key was refused (401)"
    if status == 403 or "PermissionDenied" in names:
        return "access denied (403)"
    if status == 404 or "NotFoundError" in names:
        return "not found (404): check llm.model and llm.api_base"
    if any(needle in text for needle in _NO_HOST):
        return "the host name does not resolve"
    if "connection refused" in text or "connect call failed" in text:
        return "connection refused"
    if status is not None:
        return f"the server answered {status}"
    if "Connection" in names:
        return "the connection failed"
    return type(exc).__name__


def retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return float(headers.get("retry-after"))
    except (TypeError, ValueError):
        return None


def cut_cause(exc: BaseException) -> str:
    """A short, fixed description of why a stream stopped (shown to the user)."""
    names = [type(e).__name__ for e in chain(exc)]
    if any("Timeout" in n or "TimedOut" in n for n in names):
        return "it timed out"
    if any(isinstance(e, ConnectionError | EOFError) for e in chain(exc)) or any(
            word in n for n in names for word in ("Connection", "ReadError", "RemoteProtocol",
                                                  "Payload", "Disconnected")):
        return "the connection was lost"
    return "the provider stopped sending"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
