"""The rendezvous of a data-parallel run on one machine, reachable from this machine only.

``torchrun --standalone`` (the c10d backend on ``localhost:0``), which the supervisor used to launch its
ranks with, starts two TCPStores, and a TCPStore server listens on every interface (``*:<port>``) with
no authentication: anyone who could reach the box could read and write the run's rendezvous. A run on
one machine needs nothing beyond the loopback interface, so the supervisor registers this backend with
PyTorch's elastic launcher instead: torch's own static rendezvous (one TCPStore, shared by the launcher
and the ranks, as ``torchrun`` shares it), whose server takes a socket this module has bound to
127.0.0.1 (TCPStore's ``master_listen_fd``). The ranks' own sockets (gloo's pairs, NCCL's bootstrap)
bind to the loopback interface too: ``keep_ranks_on_loopback`` names it to them.

Runs across machines use ``torchrun`` and its rendezvous, as PyTorch documents it: on a trusted network.
"""

from __future__ import annotations

import os
import socket

import psutil
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

#: The launcher's name for this backend (``LaunchConfig.rdzv_backend``).
BACKEND = "torchlab-loopback"
LOOPBACK_ADDRESS = "127.0.0.1"
#: How long the store waits for the ranks to join; as torchrun's static rendezvous.
JOIN_TIMEOUT_S = 600


class LoopbackRendezvous(StaticTCPRendezvous):
    """A single node's static rendezvous whose store listens on 127.0.0.1 only."""

    def __init__(self, run_id: str, timeout_s: int = JOIN_TIMEOUT_S) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((LOOPBACK_ADDRESS, 0))
        listener.listen(socket.SOMAXCONN)
        super().__init__(LOOPBACK_ADDRESS, listener.getsockname()[1], rank=0, world_size=1, run_id=run_id, timeout=timeout_s)
        self._listener = listener

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:  # the server serves our loopback socket; the store owns it from here on
            # No world size, as the c10d rendezvous's shared store has none: with the static rendezvous's
            # (1, the node count), about one rank process in five aborted at exit ("terminate called
            # without an active exception"); none in 22 runs without.
            self._store = TCPStore(LOOPBACK_ADDRESS, self.master_port, None, True, self.timeout, multi_tenant=True,
                                   master_listen_fd=self._listener.detach())
        return super().next_rendezvous()

    def get_backend(self) -> str:
        return BACKEND


def _create_handler(params: RendezvousParameters) -> LoopbackRendezvous:
    return LoopbackRendezvous(params.run_id)


def register() -> None:
    """Make ``BACKEND`` known to the elastic launcher of this process (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, _create_handler)


def keep_ranks_on_loopback() -> None:
    """In a rank of a single-node run, before its process group opens: gloo and NCCL bind to the loopback
    interface, not to the address the host name resolves to (on most boxes, the network's)."""
    interface = loopback_interface()
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    os.environ["NCCL_SOCKET_IFNAME"] = interface


def loopback_interface() -> str:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.family == socket.AF_INET and address.address == LOOPBACK_ADDRESS for address in addresses):
            return name
    return "lo"

