"""A BM25 retrieval service with Search-R1's request / response shape, and its client.

    python -m reinforce_pro.search.retriever --corpus data/kb/corpus.jsonl --port 8000   # index, then serve

- `POST /retrieve` `{"queries": [str, ...], "topk": 3, "return_scores": true}` ->
  `{"result": [[{"document": {"id": "p12", "contents": "title\\ntext"}, "score": 1.7}, ...], ...]}`, one list per
  query, best first (without return_scores: the documents alone), as Search-R1's retrieval_server.py answers.
- `GET /health` -> `{"status": "ok", "passages": N}`.
- Errors are JSON `{"error": "..."}`: 400 for a malformed request (a body nested too deeply to parse included),
  404 for another path, 408 for a body that stops arriving, 413 for a body over 1 MB, 503 when
  `--max_concurrency` requests are being served and no slot frees within 2 s (the client backs off, retries).
- FastAPI on uvicorn (reinforce_pro/serving.py): an idle or slow client holds a socket, not a thread, and a
  connection silent for IDLE_TIMEOUT seconds is closed, so silent connections cannot take the slots real
  requests need.
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
from pathlib import Path
from typing import TYPE_CHECKING

from reinforce_pro.search.retriever_app import MAX_BODY, MAX_QUERIES, MAX_TOPK, build_app, parse_request

if TYPE_CHECKING:
    from reinforce_pro.serving import KeptServer, LoopbackServer

__all__ = ["MAX_BODY", "MAX_QUERIES", "MAX_TOPK", "BM25Index", "RetrieverClient", "RetrieverError", "make_server",
           "parse_request"]  # fmt: skip

IDLE_TIMEOUT = 10.0  # seconds a connection may stay silent (between requests or mid-request) before it is closed
MAX_CONNECTIONS = 64  # requests in progress at once; one more is answered 503 at once


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
def make_server(
    index: BM25Index, port: int = 0, max_concurrency: int = 8, queue_timeout: float = 2.0,
    idle_timeout: float = IDLE_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
) -> LoopbackServer:  # fmt: skip
    """The service on 127.0.0.1:`port` (0: a free one; `.url` says which), not started (`.start()`, `.stop()`).
    At most `max_concurrency` requests are searched at once (each in a worker thread); one more waits up to
    `queue_timeout` s, then 503. A connection silent for `idle_timeout` s is closed, and a body that stops
    arriving for that long ends its request with 408; past `max_connections` requests in progress, one more is
    answered 503 at once. Idle connections hold a socket each, never a thread."""
    from reinforce_pro.serving import LoopbackServer

    app = build_app(index, max_concurrency, queue_timeout, idle_timeout, max_connections)
    return LoopbackServer(app, port, idle_timeout, name="retriever")


def kept_server(index: BM25Index, max_concurrency: int = 8, queue_timeout: float = 2.0) -> KeptServer:
    """The service as a run keeps it (serving.KeptServer): not started (`.start()`); `.ensure()` before each use
    starts it again on its port when it stopped answering."""
    from reinforce_pro.serving import KeptServer

    return KeptServer(lambda: build_app(index, max_concurrency, queue_timeout, IDLE_TIMEOUT, MAX_CONNECTIONS),
                      "retriever", IDLE_TIMEOUT)  # fmt: skip


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
    server.start()  # returns once the socket accepts: a script may connect as soon as the line below is printed
    print(f"[retriever] {len(index.passages)} passages; serving {server.url} (POST /retrieve, GET /health)",
          flush=True)  # fmt: skip
    try:
        while server.alive:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
