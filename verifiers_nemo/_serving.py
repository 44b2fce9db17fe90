"""``LoopThreadServer``: an aiohttp app on loopback, served from an event loop on a daemon thread of its own.

The shared base of the routing proxy and the replay server (uvicorn's ``Server`` shape: ``start`` binds
and returns once serving, ``stop`` is bounded and idempotent). Subclasses say what to serve
(``build_app``) and what to open and close with it (``on_startup`` / ``on_shutdown`` / ``before_stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)


class LoopThreadServer:
    """Serve ``build_app()`` on ``host:port`` (0: any free port) from a loop on its own daemon thread."""

    thread_name = "verifiers-nemo-server"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        backlog: int = 128,
        shutdown_grace: float = 1.0,
        use_uvloop: bool = False,
    ) -> None:
        self.host = host
        self._bind_port = port
        self._backlog = backlog
        self._shutdown_grace = shutdown_grace
        self._use_uvloop = use_uvloop
        self._lifecycle = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # -- what a subclass provides --------------------------------------------------------------

    def build_app(self) -> web.Application:
        """The app to serve (called on the server's loop)."""
        raise NotImplementedError

    async def on_startup(self) -> None:
        """Open what the handlers use (on the server's loop, before the port is bound)."""

    async def on_shutdown(self) -> None:
        """Close what ``on_startup`` opened (on the server's loop, after the app stopped)."""

    def before_stop(self) -> None:
        """Called by ``stop()`` on the caller's thread before the server shuts down (e.g. close routes)."""

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._port is not None

    @property
    def port(self) -> int:
        """The bound port (after ``start()``)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first.")
        return self._port

    @property
    def url(self) -> str:
        """``http://<host>:<port>``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop while it runs."""
        return self._loop

    @property
    def runner(self) -> web.AppRunner:
        """The app's runner (more sites can be added to it on the server's loop)."""
        if self._runner is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first.")
        return self._runner

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run ``coro`` on the server's loop from another thread and wait for its result."""
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first.")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def start(self, timeout: float = 30.0) -> Any:
        """Start the loop thread and bind the port; returns ``self`` once serving (idempotent)."""
        self._refuse_on_own_thread("start")
        with self._lifecycle:
            if self._port is not None:
                return self
            loop = _new_event_loop(self._use_uvloop)
            thread = threading.Thread(target=_run_loop, args=(loop,), name=self.thread_name, daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._port = asyncio.run_coroutine_threadsafe(self._startup(), loop).result(timeout)
            except BaseException:
                self._teardown_loop(timeout=5.0)
                raise
            logger.debug("%s listening on %s", type(self).__name__, self.url)
            return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close what was opened, within ``timeout`` (idempotent)."""
        self._refuse_on_own_thread("stop")
        with self._lifecycle:
            if self._loop is None:
                return
            self.before_stop()
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
            except Exception as exc:  # includes a timeout: go on and stop the loop anyway
                logger.warning("%s did not shut down cleanly: %r", type(self).__name__, exc)
            self._teardown_loop(timeout=max(timeout, 1.0))

    def _teardown_loop(self, timeout: float) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        self._port = None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("%s thread did not exit within %.1f s", type(self).__name__, timeout)

    def _refuse_on_own_thread(self, what: str) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError(f"{type(self).__name__}.{what}() cannot be called from its own event loop.")

    async def _startup(self) -> int:
        await self.on_startup()
        runner = web.AppRunner(
            self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=self._shutdown_grace
        )
        await runner.setup()
        self._runner = runner
        try:
            site = web.TCPSite(runner, self.host, self._bind_port, backlog=self._backlog)
            await site.start()
        except BaseException:
            await self._shutdown()
            raise
        return int(runner.addresses[0][1])

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.on_shutdown()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _new_event_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    """uvloop when wanted and installed (it roughly halves the proxy's CPU per call), else asyncio's."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
