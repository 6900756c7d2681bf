"""The services the run starts are kept: a server whose thread ended or whose event loop stopped answering is
started again on its port, with a fresh app, before its next use (serving.KeptServer)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

fastapi = pytest.importorskip("fastapi")

from reinforce_pro.serving import KeptServer, ServiceLost, service_restarts  # noqa: E402


def counting_app_factory(made: list):
    """Apps that say which one answers (1 for the first made); /stall blocks the loop for a while, as a handler
    that never awaits would."""

    def make():
        app = fastapi.FastAPI()
        made.append(app)
        number = len(made)

        @app.get("/health")
        async def health():
            return {"status": "ok", "app": number}

        @app.get("/stall")
        async def stall():
            time.sleep(3)
            return {}

        return app

    return make


def get(url: str, timeout: float = 2.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def test_a_kept_server_whose_loop_stalls_is_started_again_on_its_port_with_a_fresh_app(capsys):
    made: list = []
    kept = KeptServer(counting_app_factory(made), "test-service", check_s=0.5)
    url, restarts = kept.start(), service_restarts()
    try:
        assert kept.ensure() is False and get(url + "/health")["app"] == 1  # answering: left alone
        stalled = threading.Thread(target=lambda: _ignore_errors(lambda: get(url + "/stall", timeout=10)))
        stalled.start()
        time.sleep(0.3)  # the loop is now blocked in /stall
        assert kept.problem().startswith("GET /health failed")
        assert kept.ensure() is True and kept.url == url
        assert get(url + "/health")["app"] == 2 and service_restarts() == restarts + 1
        stalled.join(timeout=15)
    finally:
        kept.stop()
    assert not kept.alive
    assert "[test-service] stopped answering at" in capsys.readouterr().err


def test_a_kept_server_that_cannot_take_its_port_back_says_so_in_one_error():
    import socket

    made: list = []
    kept = KeptServer(counting_app_factory(made), "test-service", check_s=0.5)
    kept.start()
    port = kept.server.port
    kept.server.stop()
    squatter = socket.socket()  # another process took the port in between (no SO_REUSEADDR: it holds it alone)
    try:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(ServiceLost, match=f"could not start again on port {port}"):
            kept.ensure()
    finally:
        squatter.close()
        kept.stop()


def _ignore_errors(call) -> None:
    try:
        call()
    except Exception:  # the stalled request may be cut when its server is replaced
        pass
