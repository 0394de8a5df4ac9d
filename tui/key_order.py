"""Keys act in the order they were typed, however fast they come.

A terminal delivers keys typed fast (or sent by tmux) together, and the app routes each to the focused widget of
the screen on top before it has handled the one typed before it. Textual acts on a binding without priority only
once its key has come up from that widget to the app, and looks it up there on the screen on top by then, which a
key after it may have changed. The workbench keeps the order in two ways:

- a key that changes what takes the keys after it (opens or closes a screen, moves the focus into or out of the
  gradient filter) is bound with priority and acts as it arrives, before the next key is routed;
- every other key acts where it was routed, as it gets there (``act_on_key``): in a text field
  (``widgets.in_order_input``) and on a view (``screens.view_screen.OverlayScreen``).

And an Esc typed with a key close behind it is taken as the two keys it was (``as_typed``).
"""

from __future__ import annotations

from collections.abc import Container

from textual import events
from textual.dom import DOMNode

ALT = "alt+"


def as_typed(key: events.Key, bound: Container[str]) -> list[events.Key]:
    """The keys typed for ``key``: Esc and the key after it where the terminal's reading made one Alt key of them.

    A terminal sends Alt+m as Esc then m, so Textual reads an Esc with a key close behind it (100 ms) as Alt and
    that key: ``? Esc m 2 Enter`` in one tmux send-keys reached the app as ``? alt+m 2 Enter``, and help stayed
    open. No key of the workbench is Alt and a character, so one that nothing binds where it arrives (``bound``:
    a text field binds alt+backspace) is taken as the two keys.
    """
    if not key.key.startswith(ALT) or key.key in bound or not key.is_printable or key.character is None:
        return [key]
    character = key.character
    name = character if character.isalnum() else key.key.removeprefix(ALT)  # as Textual names the key alone: "M"
    return [events.Key("escape", "\x1b"), events.Key(name, character)]


async def act_on_key(node: DOMNode, key: str) -> bool:
    """Run ``key``'s binding from ``node`` up, as the app would once the key had come up to it; True if one ran.

    Only bindings without priority (the app ran those as the key arrived), up to the first modal screen (the
    screens beneath a dialog have none of its keys), the first that is enabled (``run_action`` is False for one
    that ``check_action`` refuses).
    """
    for namespace in node.ancestors_with_self:
        for binding in namespace._bindings.key_to_bindings.get(key, ()):
            if not binding.priority and await node.app.run_action(binding.action, namespace):
                return True
        if namespace.is_modal:
            return False
    return False
