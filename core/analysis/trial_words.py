"""Controlled trials in words (standard library only): a trial typed in the app, read into its
command, and a trial's result in words, for the headless printer and the app's log.

    trial amp=bf16 from step 40, 20 steps each on the same batches: 1.72x faster, activations -46 %,
    memory -36 %; loss 2.3012 vs 2.3007 (mean), 2.2101 vs 2.2098 (last)

Speed is the trial's own verdict (``TrialResult.speed``, core/analysis/trial_speed.py): its arms ran interleaved
in blocks, and the ratio of their step times has a 90 % interval from the blocks' pairs, ``1.71x slower
(1.64–1.79)``. A trial without one (recorded before the arms were interleaved, or too short to pair its blocks)
is judged as the impact table judges two segments (``compare_step_times``: faster or slower only where the
arms' 90 % intervals do not overlap), as it was.
"""

from __future__ import annotations

import re
import statistics

from torchlab.core.analysis.step_times import compare_step_times, load_shift
from torchlab.core.analysis.trial_speed import speed_words
from torchlab.core.records.settings import DEFAULT_TRIAL_STEPS, TRIAL_STEPS
from torchlab.core.options import PARALLEL, STEPS, WORLD_SIZE, OptionChangeError, parse_option_value
from torchlab.core.wire.payloads import TrialArm
from torchlab.core.wire.protocol import TrialCommand, TrialProgress, TrialResult

#: The options a trial cannot try, and why (the app's prompt and the trainer say the same).
NOT_TRIED = {
    WORLD_SIZE.name: "a trial cannot change the world size: that relaunches the ranks (w changes it for good)",
    PARALLEL.name: "a trial cannot change how the ranks hold the model: that relaunches them (D changes it for good)",
    STEPS.name: "a trial cannot change the run's length: its arms run as many steps as it says (e changes it for good)",
}
#: The label of a trial's second arm, which keeps the options as they are.
AS_IT_IS = "as it is"
#: What the app's trial prompt says to type.
TRIAL_HINT = f"OPTION=VALUE [STEPS], e.g. amp=bf16 or checkpointing=on 40 ({DEFAULT_TRIAL_STEPS} steps an arm if not said)"
_TRIAL = re.compile(r"\s*([A-Za-z_]+)\s*=\s*(\S+)(?:\s+(\d+))?\s*")


def parse_trial(text: str) -> TrialCommand:
    """``amp=bf16`` or ``checkpointing=on 40`` as the command that asks for it; OptionChangeError says what is wrong."""
    match = _TRIAL.fullmatch(text)
    if match is None:
        raise OptionChangeError(f"type OPTION=VALUE, then the steps if not {DEFAULT_TRIAL_STEPS}: amp=bf16 40")
    option, value = match.group(1), match.group(2)
    parse_option_value(option, value)
    if option in NOT_TRIED:
        raise OptionChangeError(NOT_TRIED[option])
    return TrialCommand(option, value, TRIAL_STEPS.parse("STEPS", match.group(3) or DEFAULT_TRIAL_STEPS))


def describe_trial(result: TrialResult) -> list[str]:
    """The trial as lines a person reads: one, and one more for each arm that stopped early."""
    if result.error is not None or len(result.arms) != 2:
        return [f"trial {result.option}={result.value} from step {result.step} could not run: {result.error}"]
    changed, as_it_is = result.arms
    head = f"trial {changed.label} from step {result.step}, {result.steps} steps each on the same batches"
    lines = [f"{head}: {trial_verdict(result)}"]
    lines += [f"  {arm.label} stopped after {arm.steps} steps: {arm.error}" for arm in result.arms if arm.error]
    return lines


def trial_label(result: TrialResult) -> str:
    """``clip=0.5``: the trial's changed arm, as its progress and its first arm name it."""
    return result.arms[0].label if result.arms else f"{result.option}={result.value}"


def trial_progress_text(progress: TrialProgress) -> str:
    """``trying clip=0.5 7/20`` in the changed arm, ``trying clip=0.5: as it is 7/20`` in the other, ``timing clip=0.5
    34/100`` past the K steps (at most 100): the app's header and the headless bar while a trial runs."""
    arm = "" if progress.arm == 1 else f": {AS_IT_IS}"
    return f"{'timing' if progress.timing else 'trying'} {progress.label}{arm} {progress.done}/{progress.steps}"


def trial_verdict(result: TrialResult) -> str:
    """What the changed arm did against the arm as it is (``1.33x slower, activations -90 %, ...``), or why the
    trial could not run."""
    if result.error is not None or len(result.arms) != 2:
        return f"could not run: {result.error}"
    speed = speed_words(result.speed) if result.speed is not None else _speed_of_arms(*result.arms)
    if result.speed is not None and result.speed.steps > result.steps:  # K steps' pairs left the interval wide
        speed += f" over {result.speed.steps} steps each"
    return ", ".join([speed, *_comparison(*result.arms)])


def _speed_of_arms(changed: TrialArm, as_it_is: TrialArm) -> str:
    """A trial without a speed record: its arms' step times compared as two segments of the impact table."""
    interval = (changed.step_time_low_s, changed.step_time_high_s) if changed.step_time_low_s is not None else None
    speedup, speed = compare_step_times(as_it_is, changed.median_step_time_s, interval)
    if speedup is not None:  # arms run one after the other: a neighbour's load that came or went is no verdict
        speed = load_shift(as_it_is.others_cpu_percent, changed.others_cpu_percent) or speed
    return speed or "no step time"


def _comparison(changed: TrialArm, as_it_is: TrialArm) -> list[str]:
    """Memory and loss: the changed arm against the arm as it is."""
    parts = []
    for name, before, after in (("activations", as_it_is.activations_bytes, changed.activations_bytes),
                                ("memory", as_it_is.tensor_bytes, changed.tensor_bytes)):
        if before and after is not None:
            change = (after - before) / before
            parts.append(f"{name} {100 * change:+.0f} %" if round(100 * change) else f"same {name}")
    if changed.losses and as_it_is.losses:
        parts.append(f"loss {statistics.fmean(changed.losses):.4f} vs {statistics.fmean(as_it_is.losses):.4f} (mean), "
                     f"{changed.losses[-1]:.4f} vs {as_it_is.losses[-1]:.4f} (last)")
    return parts
