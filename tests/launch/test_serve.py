"""``torchlab-tui serve`` (issue 16): the browser view listens on the loopback only, and since every user of the
machine can reach a loopback port, it answers only requests that carry the key it printed."""

from __future__ import annotations

import os

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from torchlab.core.launch import serve
from torchlab.core.wire.runtime import Endpoint, RunEntry


@pytest.fixture
def entry(tmp_path, monkeypatch) -> RunEntry:
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return RunEntry(Endpoint.create("20261123-204626-tiny_gpt"), {"state": "running", "pid": 1}, False)


def test_control_is_asked_for_explicitly(entry):
    server = serve.keyed_server(entry, control=True, port=8000)
    assert "--view" not in server.command


def test_with_no_live_run_serve_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert serve.main([]) == 2
    assert "no live run to serve" in capsys.readouterr().err


# ------------------------------------------------------------------------------ Origin and Host (issue 26)
# The key is a cookie once the page is open, and a cookie goes with a request the browser makes for any page of the
# same site: another user's server on 127.0.0.1 (another port is the same site), or a name an attacker's DNS points at
# 127.0.0.1 (rebinding), could drive the websocket. The Origin must be this server's, the Host a loopback name at
# its port, before any key or cookie counts.


@pytest_asyncio.fixture
async def served(entry):
    """The keyed server on 127.0.0.1, on a port the system chose, for a real client; its websocket handler answers
    the upgrade without starting an app (``upgraded`` counts the upgrades it saw)."""
    import socket

    from aiohttp import web

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = serve.keyed_server(entry, control=False, port=port)
    server.upgraded = 0

    async def answer_the_upgrade(request):
        websocket = web.WebSocketResponse()
        await websocket.prepare(request)
        server.upgraded += 1
        await websocket.close()
        return websocket

    server.handle_websocket = answer_the_upgrade
    runner = web.AppRunner(await server._make_app())
    await runner.setup()
    await web.SockSite(runner, listener).start()
    try:
        yield server, port
    finally:
        await runner.cleanup()


def browser():
    """A client that keeps cookies of 127.0.0.1 as a browser does (aiohttp's keeps none of an IP address by default)."""
    import aiohttp

    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


@pytest.mark.asyncio
async def test_the_page_takes_the_printed_key_then_its_cookie_and_refuses_any_other_request(served, entry):
    import asyncio

    server, port = served
    assert server.host == "127.0.0.1"
    assert server.command.startswith("exec env TORCHLAB_SERVED=1 ")  # the tab's app is the server's child, and dies with it
    assert server.command.endswith(f"-m torchlab.core.launch.cli attach --view {entry.endpoint.name}")
    base = f"http://127.0.0.1:{port}"
    async with asyncio.timeout(30), browser() as client:
        assert await status_of(client, f"{base}/") == 403
        assert await status_of(client, f"{base}/?key=guess") == 403
        assert await status_of(client, f"{base}/?key=%ED%A0%80") == 403  # not even UTF-8
        assert await status_of(client, f"{base}/static/js/textual.js") == 403
        async with client.get(f"{base}/?key={server.key}") as page:
            assert page.status == 200 and "data-session-websocket-url" in await page.text()
        assert await status_of(client, f"{base}/static/js/textual.js") == 200  # the cookie the first page set


async def status_of(session, url: str, **options) -> int:
    async with session.get(url, allow_redirects=False, **options) as response:
        return response.status


@pytest.mark.asyncio
async def test_the_websocket_takes_only_this_servers_origin_whatever_key_it_carries(served):
    import asyncio

    import aiohttp

    server, port = served
    base = f"http://127.0.0.1:{port}"
    async with asyncio.timeout(30), browser() as session:
        assert await status_of(session, f"{base}/?key={server.key}") == 200  # the page: sets the cookie
        for origin in (f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}",  # another server of this site
                       "http://evil.example", f"https://127.0.0.1:{port}", "null"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(f"ws://127.0.0.1:{port}/ws", origin=origin)
            assert refused.value.status == 403, origin
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # no Origin at all: no browser's websocket
            await session.ws_connect(f"ws://127.0.0.1:{port}/ws?key={server.key}")
        assert refused.value.status == 403 and server.upgraded == 0
        for origin in (base, f"http://localhost:{port}", f"http://[::1]:{port}"):
            websocket = await session.ws_connect(f"ws://127.0.0.1:{port}/ws", origin=origin)  # the cookie
            await websocket.close()
        assert server.upgraded == 3


@pytest.mark.asyncio
async def test_a_host_that_is_not_a_loopback_name_at_this_port_is_refused_before_the_key(served):
    """DNS rebinding: a page of evil.example, its name now pointing at 127.0.0.1, is same-origin with itself."""
    import asyncio

    import aiohttp

    server, port = served
    url = f"http://127.0.0.1:{port}/?key={server.key}"
    async with asyncio.timeout(30), browser() as session:
        for host in (f"evil.example:{port}", f"127.0.0.1:{port + 1 if port < 65535 else port - 1}", "127.0.0.1",
                     f"127.0.0.2:{port}", f"localhost.evil.example:{port}"):
            async with session.get(url, headers={"Host": host}) as response:
                assert response.status == 403, host
                assert "127.0.0.1" in await response.text()
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
            assert await status_of(session, url, headers={"Host": host}) == 200, host
    async with asyncio.timeout(30), browser() as session:  # a right Host is not enough: the key is still asked for
        assert await status_of(session, f"http://127.0.0.1:{port}/", headers={"Host": f"localhost:{port}"}) == 403


# ------------------------------------------------------------------------------ the port (issue 26, case 9)


@pytest.fixture
def live(entry):
    """A run that reads as live to ``serve RUN``: running, its pid this process."""
    entry.endpoint.write_info({"pid": os.getpid(), "state": "running", "step": 3, "started": 1.0, "run_dir": "runs/x"})
    return entry.endpoint.name


def test_a_port_serve_cannot_listen_on_is_one_paragraph_and_exit_2(live, capsys):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for given, said in [
            (str(port), f"port {port} on 127.0.0.1 is in use (another server listens there): choose another --port, "
                        "or leave it out for a free one."),
            ("-1", "--port -1 is not a port: give one from 1 to 65535, or leave it out for a free one."),
            ("99999", "--port 99999 is not a port: give one from 1 to 65535, or leave it out for a free one."),
        ]:
            assert serve.main([live, "--port", given]) == 2
            assert capsys.readouterr().err == f"torchlab-tui serve: {said}\n", given  # and no URL before it


def test_port_0_or_none_is_a_free_port_and_the_url_printed_is_the_one_listened_on(live, capsys, monkeypatch):
    """The URL was printed before the server tried its port: a port taken meanwhile printed a link to nothing."""
    import socket

    from aiohttp import web

    served_on = []

    def run_app(app, *, sock, **_):
        app.close()  # the coroutine that would make the app
        served_on.append(sock.getsockname()[1])
        with socket.create_connection(sock.getsockname(), timeout=10):
            pass  # listening already, as the URL was printed

    monkeypatch.setattr(web, "run_app", run_app)
    for argv in ([live], [live, "--port", "0"]):
        assert serve.main(argv) == 0
        port = served_on[-1]
        assert f"then open http://127.0.0.1:{port}/?key=" in capsys.readouterr().err and port > 0


def test_serve_as_the_user_runs_it_listens_where_it_says_and_a_bad_port_is_one_paragraph(live, tmp_path):
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    command = [sys.executable, "-m", "torchlab.core.launch.cli", "serve", live]
    refused = subprocess.run([*command, "--port", "99999"], capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == "torchlab-tui serve: --port 99999 is not a port: give one from 1 to 65535, or leave it out for a free one.\n"

    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        said = "".join(server.stderr.readline() for _ in range(3))
        link = re.search(r"then open (http://127\.0\.0\.1:\d+/\?key=\S+)", said).group(1)
        with urllib.request.urlopen(link, timeout=30) as page:  # listening already when the link was printed
            assert page.status == 200
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()


@pytest.mark.asyncio
async def test_the_page_asks_nothing_of_any_host_but_this_one(served):
    """GPU boxes are often offline: the page must load from the server alone (its web font was asked of the internet).
    A namespace (``xmlns="http://www.w3.org/2000/svg"``) is a name, never fetched."""
    import asyncio
    import re

    server, port = served
    async with asyncio.timeout(30), browser() as client:
        async with client.get(f"http://127.0.0.1:{port}/?key={server.key}") as page:
            html = await page.text()
    assert page.status == 200 and "data-session-websocket-url" in html
    fetched = re.sub(r'xmlns(:\w+)?="[^"]*"', "", html)
    outside = [url for url in re.findall(r"https?://[^\s\"'<>)]+", fetched)
               if not re.match(r"https?://(127\.0\.0\.1|localhost)(:\d+)?(/|$)", url)]
    assert outside == []


def test_without_textual_serve_the_hint_fits_an_index_and_a_checkout(entry, monkeypatch):
    import sys

    from torchlab.core.errors import TorchlabError

    monkeypatch.setitem(sys.modules, "textual_serve.server", None)  # as if the extra were not installed
    with pytest.raises(TorchlabError) as missing:
        serve.keyed_server(entry, control=False, port=8000)
    assert "pip install 'torchlab-tui[serve]'" in str(missing.value) and "pip install '.[serve]'" in str(missing.value)


def test_a_request_line_or_header_too_long_is_a_400_and_one_counted_line_not_a_traceback_each(live):
    """Any local user reaches the port without the key: each over-long line printed a traceback on the owner's terminal
    (aiohttp's LineTooLong, issue 46 item 5). They get aiohttp's 400; the terminal gets one line, with the count."""
    import re
    import signal
    import socket
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-m", "torchlab.core.launch.cli", "serve", live], stderr=subprocess.PIPE, text=True)
    try:
        banner = "".join(server.stderr.readline() for _ in range(4))
        port = int(re.search(r"open http://127\.0\.0\.1:(\d+)/", banner).group(1))
        for request in (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
                connection.sendall(request)
                answer = b""
                while chunk := connection.recv(65536):  # the server closes the connection after its 400
                    answer += chunk
            assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", answer[:100]
        server.send_signal(signal.SIGINT)
        after_banner = server.communicate(timeout=30)[1]
        assert server.returncode == 0
    finally:
        server.kill()
        server.wait()
    assert after_banner == ("torchlab-tui serve: refused 2 malformed requests with 400 (a request line or header over 8,190 "
                            "bytes, or not HTTP; this view's page sends none).\n")
