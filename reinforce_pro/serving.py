"""One way to serve an HTTP app on loopback: an ASGI app (FastAPI) on uvicorn, in a daemon thread of its own.

Both services the trainer starts use it: the OpenAI-compatible endpoint agents call (agents/openai_endpoint.py)
and the retrieval service (search/retriever.py). An event loop holds a silent or slow connection as a socket, not
as a thread, so idle clients cannot take the slots real requests need; and a connection that sends nothing for
`idle_timeout` seconds after it opens is closed, which plain uvicorn does only between requests. (uvicorn's own
`limit_concurrency` is not used: it counts open connections, so idle ones would make real requests 503; a
service bounds the requests in progress itself.)

A service the run starts is a KeptServer: checked before each use and started again on its port when it stopped
answering, so a dead server thread or a stalled event loop costs one line, not the run.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

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


_restarts = [0]  # kept services started again in this process


class ServiceLost(RuntimeError):
    """A kept service stopped answering and could not be started again on its port; one line."""


def service_restarts() -> int:
    """Kept services started again in this process so far (logged as faults/service_restarts)."""
    return _restarts[0]


class KeptServer:
    """A service the run started and keeps serving. `ensure()`, called before each use (between steps, when no
    request of the run is in flight), asks GET /health with a `check_s` limit; a server whose thread ended or
    whose loop does not answer is stopped and started again on the same port with a fresh app from `make_app`
    (its clients keep their URL), with one line on stderr. Any HTTP answer, an error status included, counts as
    answering: the loop is alive."""

    def __init__(self, make_app: Callable, name: str, idle_timeout: float = 10.0, check_s: float = 5.0):
        self.make_app, self.name, self.idle_timeout, self.check_s = make_app, name, idle_timeout, check_s
        self.server: LoopbackServer | None = None
        self.url = ""

    def start(self, port: int = 0) -> str:
        self.server = LoopbackServer(self.make_app(), port, self.idle_timeout, self.name)
        self.url = self.server.start()
        return self.url

    def problem(self) -> str | None:
        """Why the service does not answer, or None when it does."""
        if self.server is None or not self.server.alive:
            return "its server thread ended"
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=self.check_s) as response:
                response.read()
        except urllib.error.HTTPError:
            return None  # the loop answered
        except (urllib.error.URLError, OSError) as e:  # refused, reset or timed out
            return f"GET /health failed: {getattr(e, 'reason', e)}"
        return None

    def ensure(self) -> bool:
        """Start the service again if it stopped answering; True when it was started again."""
        why = self.problem()
        if why is None:
            return False
        port = self.server.port if self.server is not None else 0
        self.stop()
        try:
            self.start(port)
        except (OSError, RuntimeError) as e:
            raise ServiceLost(f"[{self.name}] stopped answering at {self.url} ({why}) and could not start again on "
                               f"port {port}: {e}") from None  # fmt: skip
        _restarts[0] += 1
        print(f"[{self.name}] stopped answering at {self.url} ({why}); started again on the same port",
              file=sys.stderr, flush=True)  # fmt: skip
        return True

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def alive(self) -> bool:
        return self.server is not None and self.server.alive
