"""``RoutePorts``: routes that own a port of the proxy (a judge's calls carry no route key; the port they
arrive on tells which route they take)."""

from __future__ import annotations

import socket

from aiohttp import web

from .route import Route


class RoutePorts:
    """Extra listening sockets of one proxy app, each bound to one route. Used on the proxy's loop."""

    def __init__(self, host: str, backlog: int) -> None:
        self.host = host
        self.backlog = backlog
        self._sites: dict[int, tuple[web.SockSite, Route]] = {}

    def __bool__(self) -> bool:
        return bool(self._sites)

    async def add(self, runner: web.AppRunner, route: Route) -> int:
        """Bind a fresh loopback port serving ``runner``'s app for ``route``; returns the port."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
            site = web.SockSite(runner, sock, backlog=self.backlog)
            await site.start()
        except BaseException:
            sock.close()
            raise
        port = int(sock.getsockname()[1])
        self._sites[port] = (site, route)
        return port

    async def remove(self, port: int) -> None:
        entry = self._sites.pop(port, None)
        if entry is not None:
            await entry[0].stop()

    def route_for(self, request: web.Request) -> Route | None:
        """The route whose port ``request`` came in on, if any."""
        if not self._sites or request.transport is None:
            return None
        sockname = request.transport.get_extra_info("sockname")
        entry = self._sites.get(int(sockname[1])) if sockname else None
        return entry[1] if entry is not None else None

    def clear(self) -> None:
        """Forget every site (their runner cleans them up)."""
        self._sites.clear()
