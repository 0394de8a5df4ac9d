"""Gradient-norm probes, clipping that reuses them, activation statistics and the probe cadence."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainers import make_trainer
from torchlab.core.engine.measure.probes import ActivationStatsProbe, GradNormProbe, ProbeCadence, clip_by_total_norm, clipped


def naive_module_norms(model: nn.Module) -> dict[str, float]:
    """The reference: per owning module, sqrt of the sum of squared per-parameter norms, via .item()."""
    norms, seen = {}, set()
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if id(p) not in seen and p.grad is not None]
        seen.update(id(p) for p in module.parameters(recurse=False))
        if params:
            norms[name or "(root)"] = math.sqrt(sum(p.grad.norm().item() ** 2 for p in params))
    return norms


class TiedNet(nn.Module):
    """Tied embedding/head weights, a parameter on the root, and a branch that gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
        self.unused = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x) * self.scale


def backward_once(model: nn.Module) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (4, 5))
    model(tokens).square().mean().backward()


def test_per_module_norms_equal_the_naive_reference():
    torch.manual_seed(0)
    model = TiedNet()
    backward_once(model)
    probe = GradNormProbe(model)
    norms = probe.measure()
    measured = dict(zip(probe.module_names, norms.per_module.tolist()))
    reference = naive_module_norms(model)
    assert set(measured) - {"unused"} == set(reference)
    for name, value in reference.items():
        assert measured[name] == pytest.approx(value, rel=1e-5), name
    assert measured["unused"] == 0.0  # no gradient: reported as zero, not skipped or NaN
    assert "head" not in probe.module_names  # the tied weight counts once, for its first owner
    all_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert norms.total.item() == pytest.approx(torch.linalg.vector_norm(torch.stack([g.norm() for g in all_grads])).item(), rel=1e-5)


def test_tied_parameters_are_named_once_with_the_other_modules_that_hold_them():
    model = TiedNet()
    model.decoder = nn.Linear(6, 10)  # ties its weight too, but keeps a bias of its own: it keeps its row
    model.decoder.weight = model.embed.weight
    probe = GradNormProbe(model)
    tied = dict(zip(probe.module_names, probe.tied_names))
    assert tied["embed"] == ["head", "decoder"]  # head has no parameter of its own left, so no row: named here
    assert "head" not in tied and tied["decoder"] == []
    assert all(names == [] for name, names in tied.items() if name != "embed")
    assert probe.param_counts[probe.module_names.index("decoder")] == 10  # its bias only


def test_clipping_from_measured_norms_matches_clip_grad_norm():
    torch.manual_seed(0)
    model, reference = TiedNet(), TiedNet()
    reference.load_state_dict(model.state_dict())
    backward_once(model)
    backward_once(reference)
    max_norm = 0.05
    expected_total = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, foreach=True)
    norms = GradNormProbe(model).measure()
    clip_by_total_norm(norms, max_norm, norms.total.item())
    assert clipped(norms.total.item(), max_norm) and norms.total.item() == pytest.approx(expected_total.item(), rel=1e-6)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        if theirs.grad is not None:
            torch.testing.assert_close(ours.grad, theirs.grad)


def test_the_total_alone_is_the_same_number_as_with_the_module_sums():
    """Clipping between the probe's steps asks for the total alone: the clip must not depend on whether the
    (self-timed, so unpredictable) probe ran on that step, or a resumed run would clip differently."""
    model = TiedNet()
    backward_once(model)
    probe = GradNormProbe(model)
    whole, total_only = probe.measure(), probe.measure(per_module=False)
    assert total_only.per_module is None and whole.per_module is not None
    assert torch.equal(total_only.total, whole.total)


def test_clipping_does_not_fire_below_the_limit():
    model = TiedNet()
    backward_once(model)
    before = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    norms = GradNormProbe(model).measure()
    clip_by_total_norm(norms, max_norm=1e6, total=norms.total.item())
    assert clipped(norms.total.item(), 1e6) is False and clipped(norms.total.item(), None) is None
    after = [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b)


def test_probe_cadence_auto_keeps_the_probe_within_budget():
    cadence = ProbeCadence("auto", budget=0.01)
    assert cadence.should_probe(1)  # measures itself first
    cadence.record_probe(1, cost_s=0.002)
    cadence.record_step(0.050)  # 2 ms probe on a 50 ms step: every 4th step keeps it at 1 %
    assert cadence.interval == 4
    assert [step for step in range(2, 12) if cadence.should_probe(step) and cadence.record_probe(step, 0.002) is None] == [5, 9]
    assert ProbeCadence(0).should_probe(1) is False
    assert ProbeCadence(3).interval == 3


def test_fixed_probe_interval_reports_norms_only_on_those_steps():
    trainer, seen = make_trainer(steps=6, probe_every=3)
    trainer.run()
    assert [r.step for r in seen.metrics if r.grad_norms is not None] == [3, 6]


def test_clipping_makes_the_total_norm_available_every_step():
    trainer, seen = make_trainer(steps=4, probe_every=0, options={"clip": "1.0"})
    trainer.run()
    assert all(r.grad_norm_total is not None and r.grad_norms is None for r in seen.metrics)


def test_activation_stats_are_sampled_and_hooks_removed_between_samples():
    trainer, seen = make_trainer(steps=4, act_stats_every=2)
    trainer.run()
    assert [r.step for r in seen.metrics if r.act_stats is not None] == [2, 4]
    stats = seen.at(2).act_stats["stem"]
    mean, std, max_abs = stats
    assert std > 0 and max_abs >= abs(mean)
    assert all(not module._forward_hooks for module in trainer.model.modules())


def test_activation_stats_count_once_under_checkpointing():
    """The recompute in backward fires forward hooks again; the statistics must be those of the first pass."""
    plain, seen_plain = make_trainer(steps=2, act_stats_every=1)
    plain.run()
    ckpt, seen_ckpt = make_trainer(steps=2, act_stats_every=1, options={"checkpointing": "on"})
    ckpt.run()
    for name, values in seen_plain.at(2).act_stats.items():
        assert seen_ckpt.at(2).act_stats[name] == pytest.approx(values, rel=1e-5, abs=1e-7), name


def test_activation_probe_reads_the_first_tensor_of_a_tuple_output():
    class TupleOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x):
            return self.linear(x), "extra"

    module = TupleOut()
    probe = ActivationStatsProbe(module, ["(root)", "linear"])
    probe.attach()
    output, _ = module(torch.ones(2, 3))
    table = probe.detach()
    assert table.shape == (2, 3) and torch.isfinite(table).all()
    assert table[0, 0].item() == pytest.approx(output.mean().item(), rel=1e-5)
