"""One way to serve an HTTP app on loopback: an ASGI app (FastAPI) on uvicorn, in a daemon thread of its own.

Both services the trainer starts use it: the OpenAI-compatible endpoint agents call (agents/openai_endpoint.py)
and the retrieval service (search/retriever.py). An event loop holds a silent or slow connection as a socket, not
as a thread, so idle clients cannot take the slots real requests need; and a connection that sends nothing for
`idle_timeout` seconds after it opens is closed, which plain uvicorn does only between requests. (uvicorn's own
`limit_concurrency` is not used: it counts open connections, so idle ones would make real requests 503; a
service bounds the requests in progress itself.)
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from uvicorn.protocols.http.h11_impl import H11Protocol


class _QuietUntilClosed(H11Protocol):
    """uvicorn's h11 protocol with its keep-alive timer started when a connection opens, not only after a
    response: a connection that never sends a request is closed after timeout_keep_alive like an idle one."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)


class LoopbackServer:
    """`app` served on 127.0.0.1:`port` (0: a free one). start() returns once it accepts connections."""

    def __init__(self, app, port: int = 0, idle_timeout: float = 10.0, name: str = "http-server"):
        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, http=_QuietUntilClosed, log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=max(1, round(idle_timeout)), backlog=2048)  # fmt: skip
        config.timeout_keep_alive = idle_timeout  # uvicorn's field takes an int; the timer takes any float
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        """Serve in this thread until stop() (the service's own command line runs it in the foreground)."""
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._socket.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
