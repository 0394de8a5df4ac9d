"""The run's ranks: their hosts from the welcome, the per-rank figures compared (stragglers flagged), and a
relaunch for a new world size, during which the trainer reports no step and the app says what is going on.

A part of ``RunState`` (state.py), which dispatches each message here; this part declares the fields it keeps
(``_init_ranks``).
"""

from __future__ import annotations

from torchlab.core.wire import protocol
from torchlab.core.options import RELAUNCHED_BY
from torchlab.core.wire.payloads import RankProcess, rank_place
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.hang import Hang, hang_sentence
from torchlab.core.wire.straggler import Straggler, straggler_sentence
from torchlab.tui.log_levels import EntryLevel
from torchlab.core.analysis.stragglers import ComparedRank, flag_stragglers
from torchlab.tui.unchecked_numbers import int_or_none


class RanksAndRelaunch:
    """How ``RunState`` follows the ranks and a change of world size."""

    def _init_ranks(self) -> None:
        """The fields of this part: no rank figures, hosts or relaunch before the trainer's welcome."""
        #: per-rank figures of the newest ``Ranks`` message, compared, in rank order (empty at world size 1)
        self.ranks: list[ComparedRank] = []
        #: the step the rank figures were gathered at
        self.ranks_step: int | None = None
        #: rank -> host, from the trainer's welcome (shown when the ranks span several hosts)
        self.rank_hosts: dict[int, str] = {}
        #: the world size a relaunch is heading to, while ``state`` is "relaunching" (None: not known)
        self.relaunch_to: int | None = None
        #: what a relaunch that keeps the world size is for (" with parallel=fsdp"), while ``state`` is "relaunching"
        self.relaunch_with = ""
        #: the rank that holds the others back for good, as the trainer judged it (None: none does, or no longer)
        self.straggler: Straggler | None = None
        #: the step a hang was said at, while no later report says that step ended (the header shows it)
        self.hung_at: int | None = None
        self.ranks_version = 0

    def _begin_relaunch(self, step: int, option: str) -> None:
        """The trainer checkpointed for a change that takes new ranks (a world size, ``parallel``): it now stops every
        rank and starts the new ones (seconds: each imports torch and joins the rendezvous), during which no step is
        reported. The trainer says nothing between this checkpoint and the new ranks' first report, so the app says
        it."""
        current = self.world_size
        if option == "world_size":
            target = int_or_none(self.pending.get("world_size"))  # None: a scripted change (--at)
            change = f"{current} → {target}" if target is not None else ""
            to = f" as {_processes(target)}" if target is not None else ""
        else:  # the same ranks, holding the model another way
            target, wanted = current, self.pending.get(option)
            change = f"{self.options.get(option)} → {wanted}" if wanted is not None else ""
            to = f" with {option}={wanted}" if wanted is not None else ""
        self.relaunch_to = target
        self.relaunch_with = to if option != "world_size" else ""
        self._set_state(RunStatus.RELAUNCHING, change)
        self.ranks, self.ranks_step, self.rank_hosts, self.straggler = [], None, {}, None
        self.ranks_version += 1
        self.log(EntryLevel.INFO, f"relaunching{to} from the checkpoint of step {step}…",
                 step, notify=True, toast=f"relaunching{to}…")

    def _relaunched(self, event: protocol.OptionApplied) -> None:
        """New ranks train (another world size, or ``parallel``): figures from before the change describe ranks that
        are gone."""
        if self.state == RunStatus.RELAUNCHING:
            self._set_state(RunStatus.RUNNING, "")
        self.ranks, self.ranks_step = [], None
        self.ranks_version += 1

    def _start_ranks(self, described: list[RankProcess]) -> None:
        """A (new) trainer's welcome: forget the figures of any earlier one; note where each rank runs."""
        self.ranks, self.ranks_step = [], None
        nodes = len({process.node for process in described})
        self.rank_hosts = {process.rank: rank_place(process.host, process.node, nodes) for process in described}
        self.ranks_version += 1

    def _on_ranks(self, event: protocol.Ranks) -> None:
        """Per-rank figures (latest wins). Ignored at world size 1, and when gathered before the last
        world-size change (a latest-wins message of ranks that are gone)."""
        if self.world_size <= 1 or event.step < max(self._applied_at.get(option, 0) for option in RELAUNCHED_BY):
            return
        in_order = sorted(event.ranks, key=lambda figures: figures.rank)
        self.ranks = flag_stragglers([ComparedRank(figures, self.rank_hosts.get(figures.rank, "")) for figures in in_order])
        self.ranks_step = event.step
        self.ranks_version += 1


    def _on_straggler(self, event: Straggler) -> None:
        """The trainer's verdict on a rank (core/analysis/stragglers.py): kept for the rank table until cleared, said."""
        self.straggler = None if event.cleared else event
        self.ranks_version += 1
        level = EntryLevel.INFO if event.cleared else EntryLevel.WARNING
        self.log(level, straggler_sentence(event), event.step, notify=not event.cleared)


    def _on_hang(self, event: Hang) -> None:
        """A step that overran (core/engine/parallel/hang_watch.py): said, and shown in the header until a report of
        that step or a later one, or the run's end."""
        self.hung_at = event.step
        self.header_version += 1
        self.log(EntryLevel.WARNING, hang_sentence(event), event.step, notify=True)

    def hang_over(self, step: int) -> None:
        """A report of ``step`` (or the run's end): a hang said before it is over."""
        if self.hung_at is not None and step >= self.hung_at:
            self.hung_at = None
            self.header_version += 1


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"
