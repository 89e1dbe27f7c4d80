"""What the simulator endpoint and the recording proxy share: serving an ASGI app on a daemon thread, with one
lifecycle (``start`` / ``close``, ``stop`` as its alias, a context manager) and one URL."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Self

from .._util import is_loopback
from ..errors import PromptCacheError

if TYPE_CHECKING:
    from ._asgi import ServerThread

log = logging.getLogger(__name__)


class LoopbackServer:
    """An ASGI app served on ``host:port`` from a daemon thread. Subclasses set ``host``, ``port`` and
    ``request_timeout`` and give the app (:meth:`_serve_app`), the thread's name and the warning logged when they
    bind beyond the loopback interface."""

    host: str
    port: int
    request_timeout: float
    #: the thread's name before ``:port``
    _thread_name = "promptcache-server"
    #: logged when ``host`` is not a loopback address (why binding a network is risky for this server)
    _network_warning = "the server listens on %s; bind 127.0.0.1 unless you mean to serve a network"
    _server: ServerThread | None = None

    def _serve_app(self) -> Any:
        """The ASGI app to serve (called once per :meth:`start`)."""
        raise NotImplementedError

    def _not_served(self) -> None:
        """Undo what :meth:`_serve_app` made when the port could not be bound (nothing by default)."""

    def start(self) -> Self:
        """Bind and serve on a daemon thread; returns self. Idempotent."""
        if self._server is not None:
            return self
        from ._asgi import ServerThread  # uvicorn loads when a server starts, not with the package

        if not is_loopback(self.host):
            log.warning(self._network_warning, self.host)
        app = self._serve_app()
        try:
            server = ServerThread(app, host=self.host, port=self.port, name=f"{self._thread_name}:{self.port}",
                                  header_timeout=self.request_timeout)
        except OSError as exc:  # a port in use, an address not on this machine: one line, nothing left behind
            self._not_served()
            raise PromptCacheError(f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): choose "
                                   "another port (--port N; 0 picks a free one)") from None
        self.port = server.port
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        """Stop serving and close the socket (calls in flight get a few seconds to finish). Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def stop(self) -> None:
        """:meth:`close` (the name this server had before)."""
        self.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._server is not None

    def _url(self, what: str) -> str:
        """``http://host:port`` (an IPv6 host in brackets); RuntimeError naming ``what`` when not running."""
        if self._server is None:
            raise RuntimeError(f"the {what} is not running; call .start() or use `with {type(self).__name__}(...)`")
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"
