"""The simulator endpoint and the recording proxy share one lifecycle (``live/_serving.py``): ``close()`` on both,
``stop()`` its alias, a context manager, and the URL only while serving."""

from __future__ import annotations

import httpx
import pytest

import promptcache_nb as pc
from promptcache_nb.live._serving import LoopbackServer


def _servers(tmp_path):
    return [pc.SimulatorServer(), pc.live.RecordingProxy("http://127.0.0.1:9", log=tmp_path / "x.jsonl")]


@pytest.mark.parametrize("which", [0, 1])
def test_close_and_stop_end_serving_on_both(tmp_path, which: int) -> None:
    server = _servers(tmp_path)[which]
    assert isinstance(server, LoopbackServer)
    url = server.start()._url("server")
    assert server.running
    httpx.get(url + "/v1/models", timeout=5)  # answers (any status): the socket is served
    server.close()
    assert not server.running
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/v1/models", timeout=2)
    server.stop()  # the alias, idempotent
    server.close()
    with pytest.raises(RuntimeError, match="not running"):
        server._url("server")


@pytest.mark.parametrize("which", [0, 1])
def test_with_closes_on_exit(tmp_path, which: int) -> None:
    with _servers(tmp_path)[which] as server:
        assert server.running
    assert not server.running


def test_every_server_refuses_a_busy_port_in_one_line(tmp_path):
    import pytest

    import promptcache_nb as pc

    with pc.SimulatorServer() as first:
        with pytest.raises(pc.errors.PromptCacheError, match=rf"cannot listen on 127\.0\.0\.1:{first.port} "):
            pc.SimulatorServer(port=first.port).start()
        proxy = pc.RecordingProxy(first.base_url, tmp_path / "log.jsonl", port=first.port)
        with pytest.raises(pc.errors.PromptCacheError, match=r"cannot listen on .*--port N"):
            proxy.start()
        assert not proxy.running
