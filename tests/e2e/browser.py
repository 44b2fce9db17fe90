"""Headless Chromium driven over the DevTools protocol (aiohttp's websocket client): open a page,
collect its console errors and uncaught exceptions, evaluate JavaScript, take screenshots."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class Page:
    """One tab: commands go to its session; console errors and exceptions are collected in ``errors``."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session
        self.errors: list[str] = []
        self.loaded = asyncio.Event()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, session=self.session, **params)

    def on_event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params") or {}
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            self.errors.append(
                f"exception: {(details.get('exception') or {}).get('description') or details.get('text')}"
            )
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))
            )
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Page.loadEventFired":
            self.loaded.set()

    async def goto(self, url: str, timeout: float = 60) -> None:
        self.loaded.clear()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(self.loaded.wait(), timeout)

    async def evaluate(self, expression: str, timeout: float = 60) -> Any:
        """The value of ``expression`` (awaited when it is a promise); a JavaScript exception raises."""
        reply = await asyncio.wait_for(
            self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True), timeout
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise AssertionError(f"JavaScript failed: {(details.get('exception') or {}).get('description') or details}")
        return reply["result"].get("value")

    async def wait_for(self, predicate: str, timeout_s: float = 30) -> None:
        """Until the JavaScript ``predicate`` holds (checked in the page on each animation frame)."""
        ok = await self.evaluate(
            f"""new Promise((resolve) => {{
                const deadline = performance.now() + {timeout_s * 1000};
                const check = () => {{
                    let value = false;
                    try {{ value = Boolean({predicate}); }} catch (e) {{}}
                    if (value) resolve(true); else if (performance.now() > deadline) resolve(false);
                    else requestAnimationFrame(check);
                }};
                check();
            }})""",
            timeout=timeout_s + 30,
        )
        assert ok, f"still false after {timeout_s}s: {predicate}"

    async def screenshot(self, path: Path) -> Path:
        reply = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(reply["data"]))
        return path


class Browser:
    """``async with Browser() as browser: page = await browser.new_page()``."""

    def __init__(self, width: int = 1440, height: int = 1000) -> None:
        self.width, self.height = width, height
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._pages: dict[str, Page] = {}

    async def __aenter__(self) -> Browser:
        executable = find_chromium()
        assert executable, "no chromium on PATH (Debian: apt-get install chromium)"
        self._profile = tempfile.mkdtemp(prefix="report-chromium-")
        self.proc = await asyncio.create_subprocess_exec(
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--allow-file-access-from-files",
            "--remote-debugging-port=0",
            f"--user-data-dir={self._profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        url = await asyncio.wait_for(self._devtools_url(), 60)
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _devtools_url(self) -> str:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").strip()
            if text.startswith("DevTools listening on "):
                return text.removeprefix("DevTools listening on ")
        raise AssertionError(f"chromium exited ({await self.proc.wait()}) before opening its DevTools port")

    async def _read(self) -> None:
        async for message in self._ws:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self._pending:
                self._pending.pop(data["id"]).set_result(data)
            elif data.get("sessionId") in self._pages:
                self._pages[data["sessionId"]].on_event(data)

    async def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        reply = await future
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def new_page(self) -> Page:
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        page = Page(self, attached["sessionId"])
        self._pages[page.session] = page
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        with contextlib.suppress(Exception):
            await self._http.close()
        self._reader.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        await self.proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)
