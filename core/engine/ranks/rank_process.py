"""One rank of a supervised run: the process the supervisor's launcher starts N of (core/engine/ranks/supervisor.py).

Each rank builds its trainer from the configuration the supervisor wrote (``ranks/config.toml``), trains its share
of each batch, and leaves without torch's teardown (``leave_without_teardown``). Rank 0 reports over the channel to
the supervisor (core/engine/ranks/channel.py), proving itself with the token the supervisor put in its environment;
the others report nothing. A rank dies with its supervisor (parent-death signal) and ignores Ctrl-C: stopping is
the supervisor's decision, sent to rank 0 as a command.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
import traceback
from pathlib import Path
from typing import NoReturn

from torchlab.core.engine.outcome import RunOutcome
from torchlab.core.engine.parallel.cpu_share import apply_thread_share
from torchlab.core.engine.parallel.distributed import RANK_MODULE, RankContext, rank_from_environment
from torchlab.core.engine.ranks.channel import TOKEN_VARIABLE, SupervisorLink
from torchlab.core.engine.parallel.preemption import stop_on_signals
from torchlab.core.engine.trainer import Trainer
from torchlab.core.errors import TorchlabError
from torchlab.core.leave import leave_without_teardown
from torchlab.core.records.config import build_config, load_config_file
from torchlab.core.wire.protocol import Error
from torchlab.core.wire.run_status import RunStatus
from torchlab.core.wire.runtime import die_with_parent

#: How long a rank other than 0 that refused its input waits before it exits: every rank makes the same checks,
#: and rank 0's report (the paragraph, exit 2) must reach the supervisor before the launcher sees this rank's exit
#: and takes the others down with it ("rank 1 failed: exited with code 2", the paragraph lost: a resume's flag the
#: ranks refused once ended so).
RANK_REFUSAL_GRACE_S = 3.0


def _leave_refused(link: SupervisorLink | None, error: TorchlabError, *, step: int, said: bool) -> NoReturn:
    """Exit 2 on input this rank refused: rank 0 first tells its supervisor (the error as an event, unless the trainer
    ``said`` it already, and the outcome ``usage``); the others wait for that to arrive (``RANK_REFUSAL_GRACE_S``)."""
    if link is None:
        time.sleep(RANK_REFUSAL_GRACE_S)
    else:
        if not said:
            link.on_event(Error(step=step, message=str(error), traceback="", rank=0))
        link.send_outcome(RunOutcome(RunStatus.USAGE, step, str(error), error=type(error)))
        link.close()
    leave_without_teardown(2)


def main(argv: list[str] | None = None) -> NoReturn:
    """One rank: ``@record`` writes its error file (the supervisor's traceback of it), then the rank leaves at once.

    Leaving by Python's own exit frees the process group first, which closes this rank's connections while it
    is still running; a peer blocked in a collective then aborts on the lost connection, and the launcher could
    see that abort (an effect) before this rank's exit (the cause) and report only the abort: "rank 0 was killed
    by signal 6" for a run whose rank 1 raised (seen under load in CI). Leaving without teardown, the peers lose
    this rank only when it has exited with its error recorded."""
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        record(_rank_main)(argv)
    except Exception:  # recorded in this rank's error file; printed to its log
        traceback.print_exc()
        leave_without_teardown(1)


def _rank_main(argv: list[str] | None) -> NoReturn:
    die_with_parent(signal.SIGKILL)  # no rank outlives the process that launched it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopping is the supervisor's decision, sent as a command
    parser = argparse.ArgumentParser(prog=f"python -m {RANK_MODULE}",
                                     description="One rank of a torchlab run (started by its supervisor).")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--explicit", default="")
    args = parser.parse_args(argv)
    context = rank_from_environment(supervised=True)
    if context is None:
        parser.error("RANK and WORLD_SIZE are not set: rank processes are started by the supervisor's launcher")
    link = SupervisorLink(args.socket, os.environ[TOKEN_VARIABLE]) if context.rank == 0 else None
    try:
        trainer = _rank_trainer(args, context, link)
    except TorchlabError as error:
        _leave_refused(link, error, step=0, said=False)
    if link is not None:
        link.attach(trainer)
    stop_on_signals(trainer.request_stop, context.rank)  # a scheduler's warning to this rank stops every rank
    try:
        outcome = trainer.run()
    except TorchlabError as error:  # the first step failed on the workload: already reported as an event
        _leave_refused(link, error, step=trainer.step, said=True)
    if link is not None:
        link.send_outcome(outcome, unhandled=trainer.pending_commands())
        link.close()
    leave_without_teardown(0)


def _rank_trainer(args: argparse.Namespace, context: RankContext, link: SupervisorLink | None) -> Trainer:
    """This rank's trainer, on the configuration the supervisor wrote and the workload loaded here (seeded first, as
    the supervisor's own process does); rank 0's reports go over ``link``."""
    from torchlab.core.engine.adapters.loading import load_workload
    from torchlab.core.engine.seeding import seed_everything

    apply_thread_share(reports=context.reports)
    config = build_config(load_config_file(args.config), {})
    seed_everything(config.seed)
    return Trainer(
        config,
        load_workload(config.workload),
        observers=[link] if link else [],
        checkpoint_dir=args.run_dir / "checkpoints",
        profiles_dir=args.run_dir / "profiles",
        resume_from=args.resume,
        explicit=[name for name in args.explicit.split(",") if name],
        ranks=context,
        can_relaunch=True,
        samples_telemetry=False,  # the supervisor samples the whole process tree, itself and every rank
    )


if __name__ == "__main__":
    main()
