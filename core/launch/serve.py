"""``torchlab-tui serve [RUN]``: the workbench on a live run in a browser, through Textual's own serving
(``textual-serve``, the ``serve`` extra), for a user who forwards the port over SSH.

Each browser tab runs ``torchlab-tui attach --view RUN`` (read-only) in a process of its own, or, with
``--control``, ``attach RUN`` (the one app that controls the run: refused while another is attached). The
server listens on ``127.0.0.1`` only, and a port on the loopback is open to every user of the machine, so the
page takes a key: the link printed here carries it, the first page sets it as a cookie, and any request
without it is refused. Only who can read this terminal (the run's owner) can open the page.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import secrets
import shlex
import socket
import sys

from torchlab.core.launch.arguments import EXIT_OK, EXIT_USAGE
from torchlab.core.wire.errors import TorchlabError
from torchlab.core.wire.runtime import FINAL_STATES, RunEntry, find_run, list_runs

HOST = "127.0.0.1"
COOKIE = "torchlab_key"
INSTALL_HINT = "pip install 'torchlab-tui[serve]' (or pip install textual-serve)"
#: Set in the environment of the app each browser tab runs: it ends when the server does (attach.py).
SERVED_BY_PARENT = "TORCHLAB_SERVED"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchlab-tui serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="the run's name (or a unique prefix) or its run directory; default: the one live run")
    parser.add_argument("--control", action="store_true", help="the page controls the run (one app may): not read-only")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one, printed)")
    args = parser.parse_args(argv)
    try:
        entry = _chosen_run(args.run)
        server = keyed_server(entry, control=args.control, port=args.port or free_port())
    except TorchlabError as error:
        print(f"torchlab-tui serve: {error}", file=sys.stderr)
        return EXIT_USAGE
    how = "controlling it" if args.control else "read-only"
    print(f"Serving {entry.endpoint.name} ({how}) on {HOST}:{server.port}. From your machine:\n"
          f"  ssh -L {server.port}:{HOST}:{server.port} <this host>\n"
          f"  then open http://{HOST}:{server.port}/?key={server.key}\n"
          f"Each tab is a viewer of its own; Ctrl-C stops serving (the run goes on).", file=sys.stderr, flush=True)
    server.serve()
    return EXIT_OK


def _chosen_run(selector: str | None) -> RunEntry:
    if selector is not None:
        try:
            entry = find_run(selector)
        except LookupError as error:
            raise TorchlabError(str(error)) from None
    else:
        live = [entry for entry in list_runs() if entry.live]
        if len(live) != 1:
            raise TorchlabError("no live run to serve" if not live else
                                f"{len(live)} live runs: name one (torchlab-tui attach lists them)")
        entry = live[0]
    if entry.state in FINAL_STATES or entry.state == "gone":
        raise TorchlabError(f"{entry.endpoint.name} is {entry.state}: there is nothing live to serve")
    return entry


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def keyed_server(entry: RunEntry, *, control: bool, port: int):
    """textual-serve's server, on the loopback, answering only requests that carry the key."""
    try:
        from aiohttp import web
        from textual_serve.server import Server
    except ImportError:
        raise TorchlabError(f"the browser view needs textual-serve: {INSTALL_HINT}") from None

    # exec: the app is the server's child, not a shell's; SERVED_BY_PARENT: it dies with the server (a tab's app
    # left behind when the server was killed kept running, spinning a core, under a shell nobody waited on).
    command = "exec " + shlex.join(["env", f"{SERVED_BY_PARENT}=1", sys.executable, "-m", "torchlab.core.launch.cli", "attach",
                                    *([] if control else ["--view"]), entry.endpoint.name])

    class KeyedServer(Server):
        key = secrets.token_urlsafe(24)

        def initialize_logging(self) -> None:
            """Warnings only: its access log would print every request (the key in the first) on this terminal."""
            logging.basicConfig(level=logging.WARNING, format="torchlab-tui serve: %(message)s")

        async def on_startup(self, app: web.Application) -> None:
            """Nothing: ``main`` has said where to point the browser (its own banner would name the command)."""

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.insert(0, self._require_key)
            return app

        @web.middleware
        async def _require_key(self, request: web.Request, handler):
            given = request.query.get("key") or request.cookies.get(COOKIE, "")
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                return web.Response(status=403, text="This view needs the link torchlab-tui serve printed (with its key).\n")
            response = await handler(request)
            if request.query.get("key"):  # the first page: the tab's later requests (its websocket) carry the cookie
                response.set_cookie(COOKIE, self.key, httponly=True, samesite="Strict")
            return response

    return KeyedServer(command, host=HOST, port=port, title=f"torchlab · {entry.endpoint.name}")
