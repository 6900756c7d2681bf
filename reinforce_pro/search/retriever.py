"""A BM25 retrieval service with Search-R1's request / response shape, and its client.

    python -m reinforce_pro.search.retriever --corpus data/kb/corpus.jsonl --port 8000   # index, then serve

- `POST /retrieve` `{"queries": [str, ...], "topk": 3, "return_scores": true}` ->
  `{"result": [[{"document": {"id": "p12", "contents": "title\\ntext"}, "score": 1.7}, ...], ...]}`, one list per
  query, best first (without return_scores: the documents alone), as Search-R1's retrieval_server.py answers.
- `GET /health` -> `{"status": "ok", "passages": N}`.
- Errors are JSON `{"error": "..."}`: 400 for a malformed request (a body nested too deeply to parse included),
  413 for a body over 1 MB, 503 when `--max_concurrency` requests are being served and no slot frees within 2 s
  (the client backs off, retries).
- A connection silent for IDLE_TIMEOUT seconds is closed, and at most MAX_CONNECTIONS are open at once (one more
  is closed as it arrives): idle or slow clients cannot pile up threads.
The server binds to 127.0.0.1 only. BM25 is the `bm25s` package (numpy only, lowercased words of 2+ characters,
English stop words removed).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_BODY = 1 << 20
DRAIN_LIMIT = 16 << 20  # an over-long body up to this size is read before the 413 (see do_POST)
MAX_QUERIES = 256
MAX_TOPK = 50
IDLE_TIMEOUT = 10.0  # seconds a connection may stay silent (between requests or mid-request) before it is closed
MAX_CONNECTIONS = 64  # open connections served at once; one more is closed at once (each holds a thread)


class BM25Index:
    """BM25 over Search-R1 corpus rows ({"id", "contents"}); `search` is thread-safe."""

    def __init__(self, passages: list[dict]) -> None:
        os.environ.setdefault("DISABLE_TQDM", "1")  # bm25s reads it at import
        import bm25s

        if not passages:
            raise ValueError("the corpus is empty")
        self._bm25s, self.passages = bm25s, passages
        self._index = bm25s.BM25()
        self._index.index(self._tokenize([p["contents"] for p in passages]), show_progress=False)
        self._lock = threading.Lock()

    @classmethod
    def from_jsonl(cls, path: Path) -> BM25Index:
        rows = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
                    raise ValueError(f'{path}:{n}: a corpus row is {{"id": ..., "contents": "title\\ntext"}}')
                rows.append({"id": str(row.get("id", n - 1)), "contents": row["contents"]})
        return cls(rows)

    def _tokenize(self, texts: list[str]):
        return self._bm25s.tokenize(texts, stopwords="en", show_progress=False)

    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict, float]]]:
        """For each query, the `topk` best passages (at most the corpus) with their BM25 scores."""
        k = min(topk, len(self.passages))
        with self._lock:
            ids, scores = self._index.retrieve(self._tokenize(queries), k=k, show_progress=False)
        return [[(self.passages[int(i)], float(s)) for i, s in zip(row, row_scores, strict=True)]
                for row, row_scores in zip(ids, scores, strict=True)]  # fmt: skip

    def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        """RetrieverClient.retrieve answered in this process: an agent can search an index it was handed."""
        return [[doc for doc, _ in hits] for hits in self.search(queries, topk)]


# ------------------------------------------------------------------------------------------ the service
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


class BoundedThreadingServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `max_connections` connection threads: one more connection is closed as it
    is accepted, before a thread is made for it."""

    daemon_threads = True
    # the listen backlog (socketserver's default is 5): a burst of connections beyond it is not refused but
    # delayed by the kernel's SYN-ACK retry (about 1 s each), so the backlog holds at least MAX_CONNECTIONS
    request_queue_size = 2 * MAX_CONNECTIONS

    def __init__(self, address, handler, max_connections: int) -> None:
        super().__init__(address, handler)
        self._connections = threading.BoundedSemaphore(max_connections)

    def process_request(self, request, client_address) -> None:
        if not self._connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: give its place back
            self._connections.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()


def make_server(
    index: BM25Index, port: int = 0, max_concurrency: int = 8, queue_timeout: float = 2.0,
    idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
) -> ThreadingHTTPServer:  # fmt: skip
    """An HTTP server on 127.0.0.1:`port` (0: a free one; `server.server_address[1]` says which), not started.
    At most `max_concurrency` requests are searched at once; one more waits up to `queue_timeout` s, then 503. A
    connection silent for `idle_timeout` s is closed; at most `max_connections` are open at once."""
    slots = threading.BoundedSemaphore(max_concurrency)

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout  # the socket's timeout: a read that waits longer ends the connection

        def log_message(self, *args) -> None:  # one line per request is noise during training
            pass

        def _reply(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path != "/health":
                return self._reply(404, {"error": f"no such path {self.path}; use POST /retrieve or GET /health"})
            self._reply(200, {"status": "ok", "passages": len(index.passages)})

        def do_POST(self) -> None:
            if self.path != "/retrieve":
                return self._reply(404, {"error": f"no such path {self.path}; use POST /retrieve"})
            declared = self.headers.get("Content-Length") or "0"
            # "abc" or "²" (a latin-1 header byte str.isdigit accepts) would raise in int(), "-1" would read until
            # the client hangs up
            if not (declared.isascii() and declared.isdigit()):
                self.close_connection = True
                return self._reply(400, {"error": f"Content-Length must be a byte count, got {declared[:40]!r}"})
            length = int(declared)
            if length > MAX_BODY:
                # Read (and drop) a moderately large body before answering: a client still sending when the
                # server closes sees a broken pipe instead of the 413. A huge one is not read: the connection closes.
                remaining = length if length <= DRAIN_LIMIT else 0
                while remaining > 0 and (chunk := self.rfile.read(min(1 << 16, remaining))):
                    remaining -= len(chunk)
                self.close_connection = True
                return self._reply(413, {"error": f"body of {length} bytes; at most {MAX_BODY}"})
            body = self.rfile.read(length)
            if not slots.acquire(timeout=queue_timeout):  # wait a little for a slot, then refuse
                return self._reply(503, {"error": f"busy: {max_concurrency} requests in flight"})
            try:
                queries, topk, scores = parse_request(body)
                hits = index.search(queries, topk)
            except ValueError as e:
                return self._reply(400, {"error": str(e)})
            finally:
                slots.release()
            result = [[{"document": doc, "score": s} if scores else doc for doc, s in row] for row in hits]
            self._reply(200, {"result": result})

    return BoundedThreadingServer(("127.0.0.1", port), Handler, max_connections)


# ------------------------------------------------------------------------------------------ the client
class RetrieverError(RuntimeError):
    """The retrieval service is down, timed out or answered something that is not the contract."""


class RetrieverClient:
    """POST /retrieve with a timeout; every failure is a RetrieverError of one line naming the URL."""

    def __init__(self, url: str, timeout: float = 5.0, retries: int = 2) -> None:
        self.url, self.timeout, self.retries = url.rstrip("/"), timeout, retries

    def _call(self, path: str, payload: dict | None = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                break
            except urllib.error.HTTPError as e:
                if e.code == 503 and attempt < self.retries:
                    time.sleep(0.1 * 2**attempt)  # busy: back off and retry
                    continue
                detail = e.read()[:200].decode(errors="replace")
                raise RetrieverError(f"retriever {self.url}{path} answered HTTP {e.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                raise RetrieverError(f"retriever {self.url}{path} is unreachable ({reason}); is it running?") from None
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RetrieverError(f"retriever {self.url}{path} answered non-JSON: {body[:80]!r}") from None

    def health(self) -> dict:
        answer = self._call("/health")
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise RetrieverError(f"retriever {self.url}/health answered {str(answer)[:120]}")
        return answer

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """For each query, its top-k documents ({"id", "contents"}), best first."""
        answer = self._call("/retrieve", {"queries": queries, "topk": topk, "return_scores": True})
        result = answer.get("result") if isinstance(answer, dict) else None
        ok = isinstance(result, list) and len(result) == len(queries)
        ok = ok and all(isinstance(row, list) and all(_is_hit(h) for h in row) for row in result)
        if not ok:
            raise RetrieverError(f"retriever {self.url}/retrieve answered outside the contract: {str(answer)[:120]}")
        return [[h["document"] for h in row] for row in result]


def _is_hit(hit) -> bool:
    doc = hit.get("document") if isinstance(hit, dict) else None
    return isinstance(doc, dict) and isinstance(doc.get("contents"), str)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help='jsonl of {"id", "contents": "title\\ntext"}')
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port, printed)")
    p.add_argument("--max_concurrency", type=int, default=8, help="requests served at once; more get 503")
    args = p.parse_args(argv)
    index = BM25Index.from_jsonl(args.corpus)
    server = make_server(index, args.port, args.max_concurrency)
    print(f"[retriever] {len(index.passages)} passages; serving http://127.0.0.1:{server.server_address[1]} "
          "(POST /retrieve, GET /health)", flush=True)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
