"""The retrieval service's routes (search/retriever.py: make_server serves them), as a FastAPI app."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

MAX_BODY = 1 << 20
MAX_QUERIES = 256
MAX_TOPK = 50
DRAIN_LIMIT = 16 << 20  # an over-long body up to this size is read (and dropped) before the 413


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a /retrieve body; ValueError with what is wrong."""
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"the body is not JSON: {e}") from None
    except RecursionError:  # [[[[...]]]] thousands deep: the parser gives up before any check could run
        raise ValueError("the body is nested too deeply to be a request") from None
    if not isinstance(request, dict):
        raise ValueError('the body must be an object: {"queries": [...], "topk": 3, "return_scores": true}')
    queries, topk = request.get("queries"), request.get("topk", 3)
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries) or not queries:
        raise ValueError('"queries" must be a non-empty list of strings')
    if len(queries) > MAX_QUERIES:
        raise ValueError(f'at most {MAX_QUERIES} "queries" per request, got {len(queries)}')
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f'"topk" must be an integer in [1, {MAX_TOPK}], got {topk!r}')
    return queries, topk, bool(request.get("return_scores", False))


def build_app(index, max_concurrency: int, queue_timeout: float, idle_timeout: float, max_requests: int):
    """The service's routes (FastAPI) over `index` (a retriever.BM25Index); every answer, an error too, is JSON."""
    app = FastAPI(title="reinforce_pro retriever", docs_url=None, redoc_url=None, openapi_url=None)
    slots = asyncio.Semaphore(max_concurrency)
    in_progress = [0]  # requests being read, waiting or searched; one past max_requests is refused at once

    @app.exception_handler(HTTPException)
    async def no_such_path(request: Request, e: HTTPException):
        message = f"no such path {request.url.path}; use POST /retrieve or GET /health"
        return JSONResponse({"error": message if e.status_code in (404, 405) else str(e.detail)}, e.status_code)

    app.state.disconnects = 0  # requests whose client hung up before its body arrived

    @app.get("/health")
    async def health():
        return {"status": "ok", "passages": len(index.passages), "client_disconnects": app.state.disconnects}

    @app.post("/retrieve")
    async def retrieve(request: Request):
        if in_progress[0] >= max_requests:
            return JSONResponse({"error": f"busy: {max_requests} requests in progress"}, 503)
        in_progress[0] += 1
        try:
            return await answer(request)
        finally:
            in_progress[0] -= 1

    async def answer(request: Request):
        declared = request.headers.get("content-length")
        try:
            body = await asyncio.wait_for(_read(request), idle_timeout)
        except TimeoutError:
            return JSONResponse({"error": f"the body stopped arriving for {idle_timeout:g} s"}, 408)
        except ClientDisconnect:  # the client hung up mid-body: an ordinary event, counted, never a traceback
            app.state.disconnects += 1
            return Response(status_code=499)
        if body is None:
            return JSONResponse({"error": f"body of {declared or 'over ' + str(MAX_BODY)} bytes; at most {MAX_BODY}"},
                                413)  # fmt: skip
        try:
            await asyncio.wait_for(slots.acquire(), queue_timeout)  # wait a little for a slot, then refuse
        except TimeoutError:
            return JSONResponse({"error": f"busy: {max_concurrency} requests in flight"}, 503)
        try:
            queries, topk, scores = parse_request(body)
            hits = await run_in_threadpool(index.search, queries, topk)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, 400)
        finally:
            slots.release()
        return {"result": [[{"document": doc, "score": s} if scores else doc for doc, s in row] for row in hits]}

    return app


async def _read(request) -> bytes | None:
    """The body, or None when it is over MAX_BODY. An over-long body up to DRAIN_LIMIT is read to its end and
    dropped before the 413: a client still sending when the connection closes would see a reset, not the answer.
    One declared longer than that is not read at all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > DRAIN_LIMIT:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > DRAIN_LIMIT:
            return None
        if size <= MAX_BODY:
            chunks.append(chunk)
    return b"".join(chunks) if size <= MAX_BODY else None
