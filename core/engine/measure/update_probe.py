"""Optimizer health per module (issue 31): how far each step moves each module's weights, and Adam's moments.

On a step the gradient-norm probe measures, ``before_update`` copies the parameters (one foreach copy: the only
memory it takes, for the length of the optimizer step) and ``after_update`` measures, on the device, for every
module with a gradient norm:

- the update-to-weight ratio ‖Δθ‖ / ‖θ‖ of the step, θ the weights it began with (the classic health figure: about
  1e-3; far below, a layer that has stopped learning; far above, one being thrashed). It follows the LR: AdamW's
  update is the LR times a normalised step, so a doubled ``lr_scale`` doubles it.
- ‖θ‖ itself;
- where the optimizer keeps Adam's moments (``exp_avg``, ``exp_avg_sq``: Adam, AdamW, NAdam, RAdam; with amsgrad,
  ``max_exp_avg_sq``, which its step divides by), ‖m‖ and ‖√v‖ (√v's norm is the root of v's sum: v ≥ 0), which
  tell a dead layer (both tiny) from a saturated one.

Per-parameter norms come from ``torch._foreach_norm``, combined per module by the gradient probe's ``module_squares``,
packed into one tensor. It is not read here: the step's one host transfer was read before its optimizer step (the
guards need the loss and norms before the update), so these figures travel with the next step's transfer, and the
measured step's row waits for them (core/engine/trainer.py); a run that ends first reads them once more itself.
Only rank 0, which reports, measures: the ranks' weights are the same; sharded (FSDP2), every rank measures its
shards, and one all-reduce of the squares per module gives the whole parameters' norms.
"""

from __future__ import annotations

import torch

from torchlab.core.engine.measure.probes import GradNormProbe


class UpdateFigures:
    """A measured step's figures on the device, ``packed`` [k, modules] (ratios, weight norms, then Adam's ‖m‖ and
    ‖√v‖ where it has them); ``values``, the host's copy, once a transfer has read them (``named`` gives them names)."""

    def __init__(self, step: int, packed: torch.Tensor, has_adam: bool) -> None:
        self.step, self.packed, self.has_adam = step, packed, has_adam
        self.values: list[float] | None = None

    def named(self, values: list[float], module_names: list[str]) -> dict[str, dict[str, float] | dict[str, list[float]]]:
        """The row's fields from the host's copy of ``packed``: update_ratios and weight_norms by module, and adam
        (module: [‖m‖, ‖√v‖]) where the optimizer keeps moments; a module whose weights are all zero has no ratio."""
        count = len(module_names)
        ratios, weights = values[:count], values[count:2 * count]
        figures: dict = {
            "update_ratios": {name: ratio for name, ratio, weight in zip(module_names, ratios, weights) if weight > 0},
            "weight_norms": dict(zip(module_names, weights)),
        }
        if self.has_adam:
            moments, roots = values[2 * count:3 * count], values[3 * count:4 * count]
            figures["adam"] = {name: [m, root] for name, m, root in zip(module_names, moments, roots)}
        return figures


class UpdateProbe:
    """Measures a step's update per module (see the module docstring)."""

    def __init__(self, grad_probe: GradNormProbe) -> None:
        self.grad_probe = grad_probe

    def before_update(self) -> list[torch.Tensor]:
        """A copy of the parameters as the optimizer step finds them."""
        with torch.no_grad():
            return torch._foreach_mul(self.grad_probe.params, 1.0)

    def after_update(self, step: int, before: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> UpdateFigures:
        """The step's figures, on the device; ``before`` (``before_update``'s copy) is used up."""
        probe, params = self.grad_probe, self.grad_probe.params
        with torch.no_grad():
            squares = [probe.module_squares(before)]
            torch._foreach_sub_(before, params)  # θ before - θ after: the update, negated
            squares.append(probe.module_squares(before))
            moments = _adam_moments(params, optimizer)
            if moments is not None:
                present, first, second = moments
                squares += [probe.module_squares(first, present), probe.module_squares(second, present, ord=1)]
            norms = probe.across_shards(torch.stack(squares)).sqrt()  # sharded: one all-reduce for all of them
            weights = norms[0]
            rows = [norms[1] / weights, weights, *norms[2:]]
            return UpdateFigures(step, torch.stack(rows), moments is not None)


def _adam_moments(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer):
    """(indices into ``params``, their exp_avg, their exp_avg_sq) where the optimizer keeps Adam's moments; None
    where it keeps them for none. Under amsgrad, the v its step divides by: the running maximum, max_exp_avg_sq."""
    present, first, second = [], [], []
    state = optimizer.state
    for index, param in enumerate(params):
        kept = state.get(param)
        if kept and "exp_avg" in kept and "exp_avg_sq" in kept:
            present.append(index)
            first.append(kept["exp_avg"])
            second.append(kept.get("max_exp_avg_sq", kept["exp_avg_sq"]))  # amsgrad divides by the running maximum
    if not present:
        return None
    return (present if len(present) < len(params) else None), first, second
