"""``torchlab-tui serve [RUN]``: the workbench on a live run in a browser, through Textual's own serving
(``textual-serve``, the ``serve`` extra), for a user who forwards the port over SSH.

Each browser tab runs ``torchlab-tui attach --view RUN`` (read-only) in a process of its own, or, with
``--control``, ``attach RUN`` (the one app that controls the run: refused while another is attached). The
server listens on ``127.0.0.1`` only, and a port on the loopback is open to every user of the machine, so the
page takes a key: the link printed here carries it, the first page sets it as a cookie, and any request
without it is refused. Only who can read this terminal (the run's owner) can open the page.

A cookie goes with every request the browser makes to this host, whichever page asks: another user's page on
``127.0.0.1`` (another port is the same site, for a cookie) or a name an attacker's DNS points at 127.0.0.1 (DNS
rebinding) could have driven the websocket with it. So before any key or cookie counts, a request must name
this server in its ``Host`` (127.0.0.1, localhost or [::1], at its port), and its ``Origin``, which a websocket
from a browser always carries, must be this server's: anything else gets 403.

The page asks nothing of another host (textual-serve's asks the internet for a web font; ``offline_page`` takes
that out): a GPU box is often offline.

The port is bound before the link is printed (``--port`` 0 or none: one the system chooses), so the link is
the one served; a port that cannot be had (in use, out of range) is one paragraph and exit 2.

Any local user can send this port anything, key or not: a request aiohttp cannot parse (a request line or header
over 8,190 bytes, bytes that are not HTTP) gets aiohttp's 400, and is counted, not logged (aiohttp logged each
with a traceback on the owner's terminal): one line says how many when serving ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import re
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Iterator

from torchlab.core.errors import EXIT_OK, EXIT_USAGE, TorchlabError, printable
from torchlab.core.launch.arguments import command_parser
from torchlab.core.wire.runtime import RunEntry, find_run, list_runs

HOST = "127.0.0.1"
#: The names a browser on this machine (or at the near end of ``ssh -L``) may give this server in its Host.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
COOKIE = "torchlab_key"
INSTALL_HINT = "pip install 'torchlab-tui[serve]', or in a checkout of torchlab-tui pip install '.[serve]'"
#: Set in the environment of the app each browser tab runs: it ends when the server does (attach.py).
SERVED_BY_PARENT = "TORCHLAB_SERVED"


def main(argv: list[str]) -> int:
    parser = command_parser("serve")
    parser.add_argument("run", nargs="?", help="the run's name (or a unique prefix) or its run directory; default: the one live run")
    parser.add_argument("--control", action="store_true", help="the page controls the run (one app may): not read-only")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default, or 0: a free one, printed)")
    args = parser.parse_args(argv)
    try:
        entry = _chosen_run(args.run)
        with listen_on(args.port) as listener:
            server = keyed_server(entry, control=args.control, port=listener.getsockname()[1])
            how = "controlling it" if args.control else "read-only"
            print(f"Serving {printable(entry.endpoint.name)} ({how}) on {HOST}:{server.port}. From your machine:\n"
                  f"  ssh -L {server.port}:{HOST}:{server.port} <this host>\n"
                  f"  then open http://{HOST}:{server.port}/?key={server.key}\n"
                  f"Each tab is a viewer of its own; Ctrl-C stops serving (the run goes on).", file=sys.stderr, flush=True)
            server.serve_on(listener)
    except TorchlabError as error:
        print(f"torchlab-tui serve: {printable(error)}", file=sys.stderr)
        return EXIT_USAGE
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
    if entry.ended:
        raise TorchlabError(f"{entry.endpoint.name} is {entry.state}: there is nothing live to serve")
    return entry


def listen_on(port: int) -> socket.socket:
    """A socket listening on ``HOST`` at ``port`` (0: one the system chooses), or TorchlabError saying why not."""
    if not 0 <= port <= 65535:
        raise TorchlabError(f"--port {port} is not a port: give one from 1 to 65535, or leave it out for a free one.")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: a port in TIME_WAIT is free
        listener.bind((HOST, port))
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRINUSE:
            why = "is in use (another server listens there)"
        elif error.errno == errno.EACCES:
            why = "needs privileges this user does not have (a port below 1024 does)"
        else:
            why = f"cannot be listened on ({error.strerror or error})"
        raise TorchlabError(f"port {port} on {HOST} {why}: choose another --port, or leave it out for a free one.") from None
    return listener


def foreign(request, port: int) -> str | None:
    """Why ``request`` is not one this server's own page made (its answer: 403), or None.

    ``Host`` must name this server at ``port``: a rebound name (``evil.example``, resolving to 127.0.0.1) is another
    site to the browser, so its page could read what this server answers. ``Origin``, which a browser sets and a page
    cannot, must be this server's own (a page of another port is another origin though the same site); a websocket
    without one is no browser's, and is refused too."""
    authorities = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    here = f"http://{HOST}:{port}/"
    if request.headers.get("Host", "").lower() not in authorities:
        return (f"This view answers only at {here}, the address torchlab-tui serve printed (through SSH, forward the same "
                f"port: ssh -L {port}:{HOST}:{port}).\n")
    origin = request.headers.get("Origin")
    if origin is None and request.headers.get("Upgrade", "").lower() == "websocket":
        return "This view's websocket is opened by its own page, which says where it comes from (Origin).\n"
    if origin is not None and origin.lower() not in {f"http://{authority}" for authority in authorities}:
        return f"This view answers only its own page, at {here}: a page of another address or port may not use it.\n"
    return None


#: A stylesheet the page would fetch from another host: textual-serve's page asks the internet for its web font.
_REMOTE_STYLESHEET = re.compile(r"<link\b[^>]*\bhref=[\"']https?://[^>]*>", re.IGNORECASE)


def offline_page(template: str) -> str:
    """textual-serve's page with no request to another host: a GPU box is often offline, and the browser then
    waited on the font (the terminal's font falls back to the browser's monospace, as the page itself says)."""
    return _REMOTE_STYLESHEET.sub("", template)


class MalformedRequests(logging.Filter):
    """Counts, and keeps off the terminal, the requests aiohttp refused with a 400 before any handler saw them
    (``HttpProcessingError``: a line too long, a method that is not one); other records pass as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            self.refused += 1
            return False
        return True

    def summary(self) -> str | None:
        """The one line for the terminal once serving ends, or None where every request was well formed."""
        if not self.refused:
            return None
        requests = "request" if self.refused == 1 else "requests"
        return (f"torchlab-tui serve: refused {self.refused} malformed {requests} with 400 (a request line or header "
                f"over 8,190 bytes, or not HTTP; this view's page sends none).")


@contextlib.contextmanager
def malformed_requests_counted(requests_log: logging.Logger) -> Iterator[None]:
    """While serving: the malformed requests aiohttp's server logs on ``requests_log`` counted, not each printed with
    its traceback (any local user can send them); then one line on the terminal says how many, if any came."""
    malformed = MalformedRequests()
    requests_log.addFilter(malformed)
    try:
        yield
    finally:
        requests_log.removeFilter(malformed)
        if (summary := malformed.summary()) is not None:
            print(summary, file=sys.stderr)


def refusal(request, port: int, key: str) -> str | None:
    """Why ``request`` gets 403 (the text of the answer), or None where it may be served: a foreign page's request,
    judged before the key since a cookie comes with a foreign page's request too, or one that lacks the key (in the
    link's query, or the cookie the first page set)."""
    foreign_page = foreign(request, port)
    if foreign_page is not None:
        return foreign_page
    given = request.query.get("key") or request.cookies.get(COOKIE, "")
    if not hmac.compare_digest(given.encode("utf-8", "replace"), key.encode()):
        return "This view needs the link torchlab-tui serve printed (with its key).\n"
    return None


def tab_command(entry: RunEntry, *, control: bool) -> str:
    """The shell command each browser tab runs: ``attach`` to ``entry`` (``--view`` unless ``control``). exec: the
    app is the server's child, not a shell's; SERVED_BY_PARENT: it dies with the server (a tab's app left behind when
    the server was killed kept running, spinning a core, under a shell nobody waited on)."""
    return "exec " + shlex.join(["env", f"{SERVED_BY_PARENT}=1", sys.executable, "-m", "torchlab.core.launch.cli", "attach",
                                 *([] if control else ["--view"]), entry.endpoint.name])


def keyed_server(entry: RunEntry, *, control: bool, port: int):
    """textual-serve's server, on the loopback, answering only requests that carry the key."""
    try:
        import aiohttp_jinja2
        import jinja2
        from aiohttp import web
        from textual_serve.server import Server
    except ImportError:
        raise TorchlabError(f"the browser view needs textual-serve: {INSTALL_HINT}") from None

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
            page = offline_page((self.templates_path / "app_index.html").read_text(encoding="utf-8"))
            aiohttp_jinja2.setup(app, loader=jinja2.DictLoader({"app_index.html": page}))
            return app

        def serve_on(self, listener: socket.socket) -> None:
            """``Server.serve`` on ``listener``, bound (and its port printed) before: the link printed is the one served."""
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self.request_exit)
            requests_log = logging.getLogger("torchlab.serve.requests")  # aiohttp's server logs each request's failure here
            with malformed_requests_counted(requests_log):
                web.run_app(self._make_app(), sock=listener, handle_signals=False, loop=loop, print=lambda *args: None,
                            logger=requests_log)

        @web.middleware
        async def _require_key(self, request: web.Request, handler):
            refused = refusal(request, self.port, self.key)
            if refused is not None:
                return web.Response(status=403, text=refused)
            response = await handler(request)
            if request.query.get("key"):  # the first page: the tab's later requests (its websocket) carry the cookie
                response.set_cookie(COOKIE, self.key, httponly=True, samesite="Strict")
            return response

    return KeyedServer(tab_command(entry, control=control), host=HOST, port=port, title=f"torchlab · {entry.endpoint.name}")
