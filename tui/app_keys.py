"""The workbench's keys: one table (``KEY_ACTIONS``) that the bindings, the footer, help and the command palette
all read, and the screen that holds them (``MainScreen``).

What each key does is the app's (``app_actions.KeyActions``); which key runs it, and when, is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.screen import Screen

from torchlab.core.options import LIVE_OPTIONS, TRIAL_KEY
from torchlab.core.wire.protocol import DEFAULT_PROFILE_STEPS

@dataclass(frozen=True)
class KeyAction:
    """One key of the workbench: binding, footer label, help and command-palette text in one place."""

    key: str
    action: str
    label: str
    help: str
    show: bool = True
    key_display: str | None = None


KEY_ACTIONS = (
    KeyAction("space", "toggle_pause", "Pause", "Pause or resume training", key_display="space"),
    *(KeyAction(o.key, f"change_option('{o.name}')", o.footer, o.help, show=o.in_footer)
      for o in LIVE_OPTIONS),
    KeyAction("p", "profile", "Profile", f"Profile the next {DEFAULT_PROFILE_STEPS} steps", show=False),
    KeyAction("P", "profiles", "Profiles", "Profiles: list the snapshots, open a table, compare two", show=False),
    KeyAction("i", "impact", "Impact", "Impact table: what each option change cost or saved (there b or s: a baseline; T: try a row)",
              show=False),
    KeyAction("t", "system", "System", "System: every GPU, host CPU/RAM, trainer memory and its history", show=False),
    KeyAction(TRIAL_KEY, "try_option", "Trial", "Trial: try an option for a few steps on the same batches, then undo it", show=False),
    KeyAction("f", "next_chart", "Chart", "Chart: samples/s or one of the workload's own metrics, in turn", show=False),
    KeyAction("F", "what_fits", "Fits", "What fits: the memory each setting would take, predicted before it is paid for",
              show=False),
    KeyAction("M", "memory", "Memory", "Memory by kind: parameters, gradients, optimizer state, activations by module", show=False),
    KeyAction("H", "heatmap", "Heatmap", "Heatmap: modules × recent steps, by gradient norm, update ratio ‖Δθ‖/‖θ‖ or weight norm",
              show=False),
    KeyAction("B", "time", "Time", "Where the time goes: the phases of each measured row over time, the verdict, the FLOPs by "
              "module and by op", show=False),
    KeyAction("K", "compile_report", "Compile", "What torch.compile did: graph breaks at their lines, recompiles and the "
              "guard that failed, compile time and what it bought", show=False),
    KeyAction("s", "save_checkpoint", "Save", "Save a checkpoint now"),
    KeyAction("d", "detach", "Detach", "Leave the app; the trainer keeps training (reattach later)", show=False),
    KeyAction("q", "quit", "Quit", "Quit: stop the trainer after a final checkpoint"),
    KeyAction("question_mark", "help", "Help", "Show every key", key_display="?"),
)

#: Actions that talk to the trainer: not while a dialog is open (the palette opened over one; the keys that run
#: them are ``MainScreen``'s, and act only while it is on top).
TRAINER_ACTIONS = frozenset(
    {"toggle_pause", "change_option", "profile", "save_checkpoint", "detach", "try_option"}
)
#: Actions that open a view: from the main screen only, so views do not pile up on each other.
VIEW_ACTIONS = frozenset({"profiles", "impact", "system", "memory", "heatmap", "time", "compile_report"})
#: What a viewer's key for a trainer action runs instead: a refusal, in one line (``app.refuse_read_only``).
READ_ONLY_ACTION = "refuse_read_only"


def action_name(key: KeyAction) -> str:
    """The action a key runs, without its arguments (``change_option('amp')`` -> ``change_option``)."""
    return key.action.split("(")[0]


def subject(key: KeyAction) -> str:
    """What a key asks for, as its refusal names it: the option's name, or the key's label (``pause``)."""
    option = next((o for o in LIVE_OPTIONS if o.key == key.key), None)
    return option.name if option is not None else key.label.lower()


def _read_only_refusals() -> list[Binding]:
    """For each key that talks to the trainer, a second binding, hidden, that only a viewer's app enables
    (``check_action``): the key is refused there on the spot, in a line saying the view is read-only, where
    the first binding, disabled in a viewer so that its footer lists only the keys that work for it, would
    let the key pass in silence. Textual tries a key's bindings in turn, up to the first one enabled."""
    return [Binding(k.key, f"app.{READ_ONLY_ACTION}({subject(k)!r})", show=False, priority=True)
            for k in KEY_ACTIONS if action_name(k) in TRAINER_ACTIONS]


class MainScreen(Screen[None]):
    """The workbench's screen: its keys (``KEY_ACTIONS``) act on the app, and only while it is on top.

    Each key is bound with priority, so it acts when it arrives, before the key typed after it is routed: keys
    come together when typed fast, and a key without priority is looked up only once it has bubbled up from the
    focused widget. By then the ``m`` after it, which opens a prompt when it arrives (``prompt.open_prompt``),
    had covered this screen, and ``a m 2 Enter`` set accum and lost the ``a``. The keys are this screen's, not
    the app's, because Textual looks a priority binding up from the screen on top: a dialog or view pushed over
    this one (help, a prompt, the error screen, the palette) keeps its own keys (``q`` closes help), where app
    bindings with priority would take them before it, and ctrl+q (the app's) still quits from anywhere. A focused
    text field (the gradient filter) still takes them as text: Textual leaves a key an Input consumes to it.
    A view closes as its closing key arrives too (``view_screen.OverlayScreen``), so in ``i i s`` typed fast the
    ``s`` arrives with this screen back on top.
    """

    BINDINGS = [
        *(Binding(k.key, f"app.{k.action}", k.label, show=k.show, key_display=k.key_display, tooltip=k.help, priority=True)
          for k in KEY_ACTIONS),
        *_read_only_refusals(),
    ]
