"""A checkpoint is data, never code: ``--resume`` imports the workload a checkpoint names only from a run
directory of the user's own whose ``config.toml`` names it too; a checkpoint with a byte changed is
"damaged"; one that loads but is not what torchlab writes (a crafted ``step``, a list for a dict, a bad RNG
state) is one paragraph and exit 2, never a traceback, never trained from.

The attack of issue 26 is played with two real users where the tests run as root: a throwaway user prepares
``/tmp/…evil.py`` and a checkpoint naming it, and the victim's ``torchlab-tui --resume`` must not import it.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainers import TINY, WORKLOADS
from torchlab.core.engine.state.checkpoint import load_checkpoint, save_checkpoint
from torchlab.core.errors import EXIT_OK, EXIT_USAGE
from torchlab.core.errors import ConfigError
from torchlab.core.launch.cli import main
from torchlab.core.launch.training_plan import refusal_to_import

EVIL = """\
from pathlib import Path
Path({marker!r}).write_text("imported")
from torchlab.sample_models.mlp import workload
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real run of the tiny workload: three steps, a checkpoint after each."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main([TINY, "--headless", "--steps", "3", "--checkpoint-every", "1", "--keep-checkpoints", "5",
                 "--telemetry-interval", "0", "--eval-every", "0", "--run-dir", str(run)]) == EXIT_OK
    return run


def copy_of(trained: Path, tmp_path: Path) -> Path:
    """A copy of the run, its last.pt again a hard link to its newest step file (copytree copies each)."""
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    last = run / "checkpoints" / "last.pt"
    last.unlink()
    os.link(max((run / "checkpoints").glob("step-*.pt")), last)
    return run


def checkpoint_naming(workload: str, source: Path, folder: Path) -> Path:
    """A checkpoint written by torchlab's own save path, whose stored configuration then names ``workload``:
    what anyone can make from a checkpoint of theirs."""
    state = load_checkpoint(source)
    lines = state["config"].splitlines()
    assert lines[0].startswith("workload = ")
    state["config"] = "\n".join([f"workload = {workload!r}".replace("'", '"'), *lines[1:]]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(folder, state["step"], state, keep=5)


def paragraph(err: str) -> str:
    """The one error paragraph a failed command printed: exactly one line that says error, no traceback."""
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error" in line]
    return line


# ----------------------------------------------------------------------------- a checkpoint never chooses code
def test_a_checkpoint_outside_a_run_directory_does_not_import_the_workload_it_names(trained, tmp_path, capsys):
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(EVIL.format(marker=str(marker)))
    loose = checkpoint_naming(f"{evil}:workload", trained / "checkpoints" / "last.pt", tmp_path / "downloads")

    assert main(["--resume", str(loose), "--headless", "--runs-root", str(tmp_path / "runs")]) == EXIT_USAGE
    assert not marker.exists()
    message = paragraph(capsys.readouterr().err)
    assert f"the checkpoint names the workload '{evil}:workload'" in message
    assert "not in a run directory" in message
    assert f"torchlab-tui {evil}:workload --resume {loose}" in message  # the way on, if the user trusts it
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_workload_given_on_the_command_line_resumes_a_loose_checkpoint(trained, tmp_path):
    loose = tmp_path / "downloads"
    loose.mkdir()
    shutil.copy(trained / "checkpoints" / "step-0000002.pt", loose / "c.pt")
    run = tmp_path / "continued"
    assert main([TINY, "--resume", str(loose / "c.pt"), "--headless", "--steps", "3", "--telemetry-interval", "0",
                 "--run-dir", str(run)]) == EXIT_OK
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 3


def test_a_run_directory_whose_config_names_other_code_is_not_trusted(trained, tmp_path, capsys):
    """The checkpoint sits in the user's run, but names code its config.toml does not: it was put there."""
    run = copy_of(trained, tmp_path)
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    planted = checkpoint_naming(f"{tmp_path / 'evil.py'}:workload", run / "checkpoints" / "last.pt", run / "checkpoints")
    assert main(["--resume", str(planted), "--headless"]) == EXIT_USAGE
    assert not marker.exists()
    message = paragraph(capsys.readouterr().err)
    assert f"its run's config.toml names {TINY!r}" in message


def test_a_run_directory_others_may_write_to_is_not_trusted(trained, tmp_path, capsys):
    run = copy_of(trained, tmp_path)
    run.chmod(0o777)
    assert main(["--resume", str(run), "--headless", "--steps", "4"]) == EXIT_USAGE
    message = paragraph(capsys.readouterr().err)
    assert f"{run} can be written by other users (mode 0777)" in message
    assert f"torchlab-tui {TINY} --resume {run / 'checkpoints' / 'last.pt'}" in message
    run.chmod(0o700)
    assert main(["--resume", str(run), "--headless", "--steps", "4", "--telemetry-interval", "0"]) == EXIT_OK


@pytest.mark.parametrize("workload", ["mlp", "convnet", "tiny_gpt"])
def test_a_built_in_sample_named_by_any_checkpoint_may_be_imported(tmp_path, workload):
    assert refusal_to_import(workload, tmp_path / "c.pt") is None


@pytest.mark.parametrize("workload", ["antigravity:workload", "os.path:join", "/tmp/x.py:workload", "x.py:workload"])
def test_a_module_or_file_named_only_by_a_loose_checkpoint_is_not_imported(tmp_path, workload):
    """An installed module is no safer than a file: ``antigravity`` opens a browser when imported."""
    assert "not in a run directory" in refusal_to_import(workload, tmp_path / "c.pt")


def test_a_workload_that_does_not_fit_the_checkpoint_names_the_first_differing_parameters(trained, tmp_path, capsys):
    run = copy_of(trained, tmp_path)
    assert main([f"{WORKLOADS / 'tiny.py'}:no_checkpoint_blocks", "--resume", str(run), "--headless"]) == EXIT_USAGE
    message = paragraph(capsys.readouterr().err)
    assert "does not fit" in message and "size mismatch" not in message
    assert "stem.weight" in message or "head.weight" in message
    assert f"the checkpoint was trained with {TINY!r}" in message


# ----------------------------------------------------------------------------- with two real users
@pytest.fixture
def other_user():
    """A throwaway user, removed afterwards (root only: CI runs as root)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a second user")
    name = f"tl{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def give_to(user: pwd.struct_passwd, *paths: Path) -> None:
    for path in paths:
        os.chown(path, user.pw_uid, user.pw_gid)


def installed_command() -> str:
    return str(Path(sys.executable).parent / "torchlab-tui")


def test_another_users_checkpoint_in_tmp_does_not_run_their_code(trained, tmp_path, other_user, capsys, monkeypatch):
    """Issue 26 (2): a user prepares /tmp/…evil.py and a checkpoint whose stored config names it, loose and in a
    run directory of theirs that names it too; the victim resumes each, the first with the installed command, the
    others with ``cli.main`` in this process (the same refusal; a process each was a torch import each). Nothing
    of the attacker's is imported."""
    tag = secrets.token_hex(4)
    marker = Path(f"/tmp/torchlab-imported-{tag}")
    evil = Path(f"/tmp/torchlab-evil-{tag}.py")
    attackers_run = Path(f"/tmp/torchlab-run-{tag}")
    try:
        evil.write_text(EVIL.format(marker=str(marker)))
        checkpoint = checkpoint_naming(f"{evil}:workload", trained / "checkpoints" / "last.pt", attackers_run / "checkpoints")
        (attackers_run / "config.toml").write_text((trained / "config.toml").read_text().replace(TINY, f"{evil}:workload"))
        loose = Path(f"/tmp/torchlab-evil-{tag}.pt")
        shutil.copy(checkpoint, loose)
        give_to(other_user, evil, loose, attackers_run, *attackers_run.rglob("*"))

        monkeypatch.chdir(tmp_path)
        for resumed, why in ((loose, "it is not in a run directory"), (checkpoint, f"belongs to {other_user.pw_name}"),
                             (attackers_run, f"belongs to {other_user.pw_name}")):
            argv = ["--resume", str(resumed), "--headless", "--runs-root", str(tmp_path / "runs")]
            if resumed == loose:
                victim = subprocess.run([installed_command(), *argv], capture_output=True, text=True, timeout=120)
                code, err = victim.returncode, victim.stderr
            else:
                capsys.readouterr()
                code, err = main(argv), capsys.readouterr().err
            assert code == EXIT_USAGE, err
            assert not marker.exists()
            message = paragraph(err)
            assert f"the checkpoint names the workload '{evil}:workload'" in message and why in message
        assert not (tmp_path / "runs").exists()
    finally:
        for path in (marker, evil, Path(f"/tmp/torchlab-evil-{tag}.pt")):
            path.unlink(missing_ok=True)
        shutil.rmtree(attackers_run, ignore_errors=True)


def test_resuming_another_users_private_run_is_one_paragraph(trained, tmp_path, other_user):
    """Their run is 0700: the victim (root without its power to read anything) is told so, no traceback."""
    run = copy_of(trained, tmp_path)
    for path in (run, *run.rglob("*")):
        os.lchown(path, other_user.pw_uid, other_user.pw_gid)
    run.chmod(0o700)
    tmp_path.chmod(0o755)
    as_a_plain_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's power to read any file")
    for resumed, where in ((run, ["--headless"]), (run, []), (run / "checkpoints" / "last.pt", [])):  # [] : the app
        victim = subprocess.run([*as_a_plain_user, installed_command(), "--resume", str(resumed), *where, "--runs-root",
                                 str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert victim.returncode == EXIT_USAGE, victim.stderr
        message = paragraph(victim.stderr)
        assert f"--resume {resumed}: cannot be read: permission denied" in message
        assert "private to the user who started it" in message


# ----------------------------------------------------------------------------- a digest of its contents
def flip_a_byte_of_the_weights(path: Path) -> None:
    """Flip one byte inside a tensor's data: the file still loads, with other weights."""
    weights = torch.load(path, weights_only=True)["model"]["stem.weight"]
    data = bytearray(path.read_bytes())
    offset = data.find(weights.numpy().tobytes()[:64])
    assert offset > 0
    data[offset + 5] ^= 0x40
    path.write_bytes(bytes(data))
    assert not torch.equal(torch.load(path, weights_only=True)["model"]["stem.weight"], weights)


def test_a_flipped_byte_is_damaged_and_names_the_newest_intact_checkpoint(trained, tmp_path, capsys):
    run = copy_of(trained, tmp_path)
    flip_a_byte_of_the_weights(run / "checkpoints" / "step-0000003.pt")  # last.pt is the same file
    with pytest.raises(ConfigError) as raised:
        load_checkpoint(run)
    message = str(raised.value)
    last = run / "checkpoints" / "last.pt"
    assert message.startswith(f"--resume {last}: damaged: its contents do not match the sha256 digest")
    assert message.endswith(f"The newest intact checkpoint beside it is step-0000002.pt: resume from it with "
                            f"--resume {run / 'checkpoints' / 'step-0000002.pt'}.")

    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["--resume", str(run), "--headless", "--steps", "5"]) == EXIT_USAGE  # never trained from
    assert "damaged" in paragraph(capsys.readouterr().err)
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_a_checkpoint_without_a_digest_is_refused(trained, tmp_path):
    """Written by torch.save alone (not by torchlab, or by a torchlab before digests): refused, saying so."""
    state = torch.load(trained / "checkpoints" / "last.pt", weights_only=True)
    torch.save(state, tmp_path / "plain.pt")
    with pytest.raises(ConfigError) as raised:
        load_checkpoint(tmp_path / "plain.pt")
    assert str(raised.value).startswith(f"--resume {tmp_path / 'plain.pt'}: truncated or not a checkpoint torchlab wrote")
    assert "older torchlab" in str(raised.value)


# ----------------------------------------------------------------------------- crafted but loadable
def _python_rng_cut_short(state):
    state["rng"]["python"] = (3, (1, 2, 3), None)


CRAFTED = {
    "missing step": (lambda s: s.pop("step"), "its step is missing"),
    "step as text": (lambda s: s.update(step="abc"), "its step is 'abc'"),
    "negative step": (lambda s: s.update(step=-4), "its step is -4"),
    "a list for the model": (lambda s: s.update(model=list(s["model"].values())), "its model is a list"),
    "a list for the optimizer": (lambda s: s.update(optimizer=[]), "its optimizer is a list"),
    "param_groups as text": (lambda s: s["optimizer"].update(param_groups="abc"), "its optimizer.param_groups is 'abc'"),
    "a float tensor for the torch RNG": (lambda s: s["rng"].update(torch=torch.zeros(3)), "its rng.torch is a float32 tensor"),
    "a python RNG cut short": (_python_rng_cut_short, "its rng.python is"),
    "data position as text": (lambda s: s.update(data={"epoch": "x", "samples": 0}), "its data.epoch is 'x'"),
    "an unknown live option": (lambda s: s["options"].update(turbo=True), "its options.turbo is"),
    "a live option out of bounds": (lambda s: s["options"].update(accum=10**30), "its options.accum is"),
    "elapsed time as text": (lambda s: s.update(elapsed_s="abc"), "its elapsed_s is 'abc'"),
    "no configuration": (lambda s: s.update(config=5), "its config is 5"),
    "a grad scaler as text": (lambda s: s.update(grad_scaler="abc"), "its grad_scaler is 'abc'"),
    "nested too deep": (lambda s: s["scheduler"].update(base_lrs=_nested(200)), "its scheduler.base_lrs"),
    "a spike window of text": (lambda s: s["spike_guard"].update(loss=["abc"]), "its spike_guard.loss is a list"),
    "a cool-down without its end": (lambda s: s["spike_guard"].update(cooldown={"scale": 0.5, "restore": 1.0}),
                                    "its spike_guard.cooldown is"),
    "a rank's buffers as text": (lambda s: s.update(buffers_by_rank=[{}, {"blocks.0.running_mean": "abc"}]),
                                 "its buffers_by_rank[1].blocks.0.running_mean is 'abc'"),
}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("crafted", CRAFTED, ids=list(CRAFTED))
def test_a_crafted_but_loadable_checkpoint_is_one_paragraph_and_never_trained_from(trained, tmp_path, capsys, crafted):
    craft, expected = CRAFTED[crafted]
    run = copy_of(trained, tmp_path)
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    craft(state)
    path = save_checkpoint(run / "checkpoints", 9, state, keep=5)  # torchlab's own save: the digest is right
    metrics = (run / "metrics.jsonl").read_bytes()

    assert main(["--resume", str(path), "--headless", "--steps", "12", "--telemetry-interval", "0"]) == EXIT_USAGE
    message = paragraph(capsys.readouterr().err)
    assert f"--resume {path}: not a checkpoint torchlab wrote: {expected}" in message
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_a_checkpoint_from_before_the_spike_guard_kept_its_state_resumes_with_a_fresh_window(trained, tmp_path):
    run = copy_of(trained, tmp_path)
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    del state["spike_guard"]
    path = save_checkpoint(run / "checkpoints", 9, state, keep=5)
    assert main(["--resume", str(path), "--headless", "--steps", "10", "--telemetry-interval", "0"]) == EXIT_OK


def test_ranks_relaunched_from_a_checkpoint_import_the_workload_the_run_was_started_with(tmp_path):
    """A relaunch takes the checkpoint's configuration (a live steps change is in it), but not its workload: the code
    the new ranks import is the user's, never one a file names."""
    from torchlab.core.engine.ranks.supervisor import configuration_at
    from torchlab.core.records.config import build_config

    started = build_config({"workload": TINY, "steps": 10})
    planted = build_config({"workload": f"{WORKLOADS / 'misbehaving.py'}:workload", "steps": 30})
    path = tmp_path / "last.pt"
    torch.save({"config": planted.to_toml()}, path)
    relaunched = configuration_at(path, started)
    assert relaunched.steps == 30 and relaunched.workload == TINY
