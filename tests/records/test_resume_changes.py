"""What a resume changed, said once (core/records/resume_changes.py): by the launcher's plan and, with the world size
only it knows, by the supervisor, in the same words."""

from __future__ import annotations

from torchlab.core.records.resume_changes import SettingChange, describe_changes, resume_note


def test_no_change_is_no_note():
    assert resume_note([]) is None


def test_changes_that_keep_the_run_exact_are_said_plainly_and_journalled_as_information():
    changes = [SettingChange("lr_scale", 1.0, 0.5), SettingChange("world_size", 2, 1)]
    note = resume_note(changes)
    assert note == {"changes": [c.as_dict() for c in changes], "message": "resumed with lr_scale 1.0 → 0.5 and world_size 2 → 1",
                    "level": "info"}
    assert [SettingChange.of_record(record) for record in note["changes"]] == changes


def test_a_change_that_breaks_exactness_is_a_warning_that_says_so_first():
    changes = [SettingChange("world_size", 2, 1), SettingChange("lr", 0.001, 0.002), SettingChange("seed", 0, 1)]
    assert describe_changes(changes) == ("resumed with lr 0.001 → 0.002 and seed 0 → 1: from here on the run differs from "
                                         "one that was never stopped; also world_size 2 → 1")
    assert resume_note(changes)["level"] == "warning"
