"""``torchlab-tui serve`` (issue 16): the browser view listens on the loopback only, and since every user of the
machine can reach a loopback port, it answers only requests that carry the key it printed."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from torchlab.core.launch import serve
from torchlab.core.wire.runtime import Endpoint, RunEntry


@pytest.fixture
def entry(tmp_path, monkeypatch) -> RunEntry:
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return RunEntry(Endpoint.create("20261123-204626-tiny_gpt"), {"state": "running", "pid": 1}, False)


@pytest.mark.asyncio
async def test_the_page_takes_the_printed_key_then_its_cookie_and_refuses_any_other_request(entry):
    server = serve.keyed_server(entry, control=False, port=serve.free_port())
    assert server.host == "127.0.0.1"
    assert server.command.startswith("exec env TORCHLAB_SERVED=1 ")  # the tab's app is the server's child, and dies with it
    assert server.command.endswith(f"-m torchlab.core.launch.cli attach --view {entry.endpoint.name}")
    async with TestClient(TestServer(await server._make_app())) as client:
        assert (await client.get("/")).status == 403
        assert (await client.get("/", params={"key": "guess"})).status == 403
        assert (await client.get("/static/js/textual.js")).status == 403
        page = await client.get("/", params={"key": server.key})
        assert page.status == 200 and "data-session-websocket-url" in await page.text()
        assert (await client.get("/static/js/textual.js")).status == 200  # the cookie the first page set


def test_control_is_asked_for_explicitly(entry):
    server = serve.keyed_server(entry, control=True, port=serve.free_port())
    assert "--view" not in server.command


def test_with_no_live_run_serve_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "xdg").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert serve.main([]) == 2
    assert "no live run to serve" in capsys.readouterr().err
