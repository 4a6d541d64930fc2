"""How the simulator writes answers: compact JSON as SGLang (orjson), SGLang's error body shapes, SSE chunks."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from . import protocol as P


def dumps(obj: Any) -> str:
    # SGLang serializes with orjson: compact, UTF-8.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(obj), status=status, content_type="application/json")


def error_body(e: P.SimError) -> web.Response:
    if e.kind == "pydantic":
        return json_response(
            {"object": "error", "message": e.message, "type": "Bad Request", "param": None, "code": 400}, 400
        )
    if e.kind == "contract":
        return json_response({"error": e.message}, e.status)
    if e.kind == "internal":
        return web.Response(text="Internal Server Error", status=500, content_type="text/plain")
    if e.status >= 500:
        return json_response(
            {"object": "error", "message": e.message, "type": str(e.status), "param": None, "code": e.status}, e.status
        )
    return json_response({"error": {"message": e.message}}, e.status)


def stream_error_chunk(e: P.SimError, version: str) -> dict[str, Any]:
    err: dict[str, Any] = {"message": e.message}
    if version == P.V0_5_23:
        err.update({"type": "invalid_request_error", "code": e.status, "retryable": False})
    return {"error": err}


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()
