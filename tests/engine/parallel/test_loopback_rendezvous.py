"""The single-node rendezvous listens on the loopback address only (issue 12), and still is a store."""

from __future__ import annotations

import datetime
import os

import psutil
from torch.distributed import TCPStore

from torchlab.core.engine.parallel.loopback_rendezvous import BACKEND, LoopbackRendezvous, keep_ranks_on_loopback


def listening_here() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}


def test_the_store_listens_on_127_0_0_1_and_serves_the_ranks_there():
    before = listening_here()
    rendezvous = LoopbackRendezvous("run-1", timeout_s=30)
    info = rendezvous.next_rendezvous()
    store_info = info.bootstrap_store_info
    assert (store_info.master_addr, info.rank, info.world_size) == ("127.0.0.1", 0, 1)
    assert listening_here() - before == {("127.0.0.1", store_info.master_port)}
    # A rank joins as the launcher tells it to (TORCHELASTIC_USE_AGENT_STORE: MASTER_ADDR, MASTER_PORT).
    rank = TCPStore(store_info.master_addr, store_info.master_port, is_master=False, timeout=datetime.timedelta(seconds=30))
    rank.set("from-a-rank", "hello")
    assert rendezvous._store.get("from-a-rank") == b"hello"
    assert rendezvous.get_backend() == BACKEND and rendezvous.use_agent_store


def test_ranks_bind_gloo_and_nccl_to_the_interface_that_holds_127_0_0_1(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")  # a user's setting for multi-node runs does not apply here
    keep_ranks_on_loopback()
    loopback = next(name for name, addresses in psutil.net_if_addrs().items() if any(a.address == "127.0.0.1" for a in addresses))
    assert os.environ["GLOO_SOCKET_IFNAME"] == os.environ["NCCL_SOCKET_IFNAME"] == loopback
