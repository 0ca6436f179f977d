"""CISPO's loss on its worked example (docs/algorithms.md#cispo): the clipped, detached IS weight times the
advantage times the log-prob; every token keeps a gradient, where PPO's clip drops the first token's."""
import math

import pytest
import torch

from graftzoo.algos.cispo.learner import cispo_loss
from graftzoo.algos.functional import clipped_surrogate
from graftzoo.algos.losses import LossInputs, get_loss
from graftzoo.contract.registry import get_algo

CLIP = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": None}


def _inputs(logp):
    old = logp.detach() - torch.tensor([[math.log(1.5), math.log(0.5), 0.0]], dtype=torch.float64)
    ones = torch.ones(1, 3, dtype=torch.float64)
    return LossInputs(logp, old, torch.tensor([2.0], dtype=torch.float64), ones, torch.ones(1, dtype=torch.float64),
                      torch.zeros(1, dtype=torch.long), ones, torch.zeros(1, dtype=torch.float64))


def test_the_worked_example_token_losses_and_gradients():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    out = cispo_loss(_inputs(logp), None, CLIP)
    assert out.ratio.tolist()[0] == pytest.approx([1.5, 0.5, 1.0], abs=1e-12)
    assert out.token_loss.tolist()[0] == pytest.approx([2.56, 3.2, 1.0], abs=1e-12)
    assert out.clipped_high.tolist() == [[True, False, False]] and out.clipped_low.tolist() == [[False, True, False]]
    out.token_loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-2.56, -1.6, -2.0], abs=1e-12)


def test_a_clipped_token_keeps_its_gradient_where_ppo_drops_it():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64, requires_grad=True)
    x = _inputs(logp)
    ppo, _ = clipped_surrogate(logp, x.old_logp, x.advantages, CLIP["eps_low"], CLIP["eps_high"])
    (g_ppo,) = torch.autograd.grad(ppo.sum(), logp)
    (g_cispo,) = torch.autograd.grad(cispo_loss(x, None, CLIP).token_loss.sum(), logp)
    assert g_ppo[0, 0] == 0 and g_cispo[0, 0] == pytest.approx(-2.56)


def test_the_learner_names_its_registered_loss():
    assert get_loss(get_algo("cispo").loss) is cispo_loss
