"""How a workload metric's validation figure is named (core/wire/metric_names.py): a plain workload's ``acc`` is
``val acc``; a LightningModule's ``train_acc`` is ``val_acc``, as it logged it; ``train_loss``'s is the row's own
``val_loss``."""

from __future__ import annotations

from torchlab.core.wire.metric_names import training_key, validation_key, validation_label, validation_label_of


def test_a_plain_name_keeps_its_name_and_a_train_name_becomes_its_val_name():
    assert validation_key("acc") == "acc"
    assert validation_key("train_acc") == "val_acc"
    assert validation_key("train_loss") is None  # the row's val_loss, not repeated
    assert validation_key("train_") == "train_"


def test_a_validation_key_leads_back_to_its_training_metric():
    assert training_key("val_acc", {"train_acc"}) == "train_acc"
    assert training_key("acc", {"acc"}) == "acc"
    assert training_key("val_acc", {"val_acc"}) == "val_acc"  # a line written before the rule


def test_labels_say_validation_once():
    assert validation_label("val_acc") == "val_acc" and validation_label("accuracy") == "val accuracy"
    assert [validation_label_of(name) for name in ("acc", "train_acc", "train_loss")] == ["val acc", "val_acc", "val_loss"]
