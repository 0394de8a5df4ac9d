"""How a workload metric's validation figure is named: in ``val_metrics`` (metrics.jsonl, the protocol) and on
screen. Standard library only: the trainer writes by it and the app, ``compare`` and the headless lines read by it.

A metric named ``<name>`` in training (a plain workload's ``loss_fn`` gives the same names evaluating) has its
validation figure under ``<name>`` too, shown as ``val <name>``. Named ``train_<name>``, the convention a
LightningModule logs by (``train_acc`` in ``training_step``, ``val_acc`` in ``validation_step``), its validation
figure is ``val_<name>``, as logged, and shown so; ``train_loss``'s is the row's own ``val_loss``, not repeated in
``val_metrics`` (issue 45: the figures were journalled and charted as ``val train_acc``).
"""

from __future__ import annotations

from collections.abc import Container

TRAINING_PREFIX, VALIDATION_PREFIX = "train_", "val_"


def validation_key(name: str) -> str | None:
    """The key of training metric ``name``'s validation figure in ``val_metrics``; None where that figure is the
    row's ``val_loss`` (``train_loss``)."""
    if not name.startswith(TRAINING_PREFIX) or name == TRAINING_PREFIX:
        return name
    key = VALIDATION_PREFIX + name.removeprefix(TRAINING_PREFIX)
    return None if key == "val_loss" else key


def training_key(key: str, training_names: Container[str]) -> str:
    """The training metric that ``val_metrics``'s ``key`` is the validation figure of (its chart's other line): the
    same name where training has it (a plain workload's, or a line written before this rule), else ``train_<name>``
    for ``val_<name>``."""
    if key in training_names or not key.startswith(VALIDATION_PREFIX):
        return key
    return TRAINING_PREFIX + key.removeprefix(VALIDATION_PREFIX)


def validation_label(key: str) -> str:
    """``val_metrics``'s ``key`` as shown: ``val_acc`` as it is (it says validation itself), ``accuracy`` as
    ``val accuracy``."""
    return key if key.startswith(VALIDATION_PREFIX) else f"val {key}"


def validation_label_of(name: str) -> str:
    """How the validation line of training metric ``name``'s chart is named."""
    return validation_label(validation_key(name) or "val_loss")
