"""Every error of the server as JSON in its route's shape (guard.error_response): one line, the right status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnlab.errors import AttnlabError, one_line
from attnlab.serve.guard import error_response
from attnlab.serve.openai_api import APIError
from attnlab.serve.openai_schema import BadField, clip

MAX_MESSAGE = 1_000  # characters of an error message: a client's values in it are cut to this


def invalid(e: RequestValidationError) -> str:
    """Pydantic's complaints as one line: "prompt: String should have at most 2000 characters"."""
    parts = []
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'cannot parse it')})")
            continue
        where = ".".join(shown(x) for x in (loc[1:] if loc[:1] == ["body"] and len(loc) > 1 else loc))
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts) or "invalid request"


def unparsed(cause: BaseException) -> str:
    """Why FastAPI could not read a body as JSON (it says only "There was an error parsing the body")."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at byte {cause.start + 1})"
    if isinstance(cause, RecursionError):
        return "the body's JSON nests too deeply (a request needs 5 levels)"
    if "integer string conversion" in str(cause):  # the limit on digits: its message names Python's setting
        return "the body is not valid JSON (a number of over 4,300 digits)"
    return f"the body is not valid JSON ({one_line(cause)})"


def shown(name: str) -> str:
    """A name from the client (a field, a key) for a message: itself if short and printable, else clipped."""
    return name if len(name) <= 40 and name.isprintable() else clip(name)


def single(message: str) -> str:
    """An error message as one line of at most MAX_MESSAGE characters, whatever the client's values in it."""
    line = " ".join(message.split())
    return line if len(line) <= MAX_MESSAGE else f"{line[:MAX_MESSAGE]}..."


def add_error_handlers(app: FastAPI) -> None:
    """Every error as JSON in its route's shape (guard.error_response): one line, the right status."""

    def reply(request: Request, status: int, message: str, code: str | None = None, param=None, headers=None):
        return error_response(request.url.path, status, single(message), code, param, headers)

    def validation(request: Request, e: RequestValidationError):
        if not request.url.path.startswith("/v1"):
            return reply(request, 422, invalid(e))
        errors = e.errors()
        extra = [str(err["loc"][-1]) for err in errors if err.get("type") == "extra_forbidden"]
        if extra:  # OpenAI's words for a field it does not know (the client's: a few, cut short)
            more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
            names = ", ".join(shown(x) for x in extra[:5]) + more
            return reply(
                request, 400, f"Unrecognized request argument supplied: {names}", "unknown_parameter", shown(extra[0])
            )
        loc = [str(x) for x in errors[0].get("loc", ())] if errors else []
        return reply(request, 400, invalid(e), "invalid_value", ".".join(loc[1:]) or None)

    codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 429: "rate_limit_exceeded"}
    app.add_exception_handler(APIError, lambda r, e: reply(r, e.status, str(e), e.code, e.param))
    app.add_exception_handler(BadField, lambda r, e: reply(r, 400, one_line(e), "invalid_value", e.param))
    app.add_exception_handler(AttnlabError, lambda r, e: reply(r, 400, one_line(e), "invalid_value"))
    app.add_exception_handler(RequestValidationError, validation)

    def http_error(r: Request, e: StarletteHTTPException):
        message = unparsed(e.__cause__) if e.status_code == 400 and e.__cause__ is not None else str(e.detail)
        return reply(r, e.status_code, message, codes.get(e.status_code), None, getattr(e, "headers", None))

    app.add_exception_handler(StarletteHTTPException, http_error)
    # Anything else is a bug: the client gets one line, the log the traceback, and the server goes on.
    app.add_exception_handler(
        Exception, lambda r, e: reply(r, 500, f"internal error: {type(e).__name__}: {one_line(e)}", "internal_error")
    )
