"""The divergences of `fic.training.losses` against naive references (textbook formulas on full
softmaxes), their estimators, and the trust region on the teacher."""

from __future__ import annotations

import pytest
import torch

from fic.core.errors import FicError
from fic.training.losses import divergence, trust_region, window_backward


def naive(kind, s_logits, t_logits, beta=0.5, temperature=1.0):
    """Textbook formulas on full softmaxes, written independently of fic.training.losses."""
    p_s = torch.softmax(s_logits / temperature, -1)
    p_t = torch.softmax(t_logits / temperature, -1)
    if kind == "forward_kl":
        return (p_t * (p_t.log() - p_s.log())).sum(-1)
    if kind == "reverse_kl":
        return (p_s * (p_s.log() - p_t.log())).sum(-1)
    m = beta * p_t + (1 - beta) * p_s
    return beta * (p_t * (p_t / m).log()).sum(-1) + (1 - beta) * (p_s * (p_s / m).log()).sum(-1)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_full_divergences_match_naive_values_and_gradients(kind, temperature):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 50, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(6, 50, generator=g, dtype=torch.float64)
    s2 = s.detach().clone().requires_grad_(True)
    got = divergence(s, torch.log_softmax(t / temperature, -1), kind, beta=0.3, temperature=temperature)
    want = naive(kind, s2, t, beta=0.3, temperature=temperature)
    assert torch.allclose(got.double(), want, atol=1e-6)
    got.sum().backward()
    want.sum().backward()
    assert torch.allclose(s.grad, s2.grad, atol=1e-6)


def test_topk_with_tail_is_exact_when_the_tails_agree_and_close_otherwise():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(4, 40, generator=g)
    same = divergence(s, torch.log_softmax(s, -1), "forward_kl", estimator="topk", top_k=5)
    assert torch.allclose(same, torch.zeros(4), atol=1e-6)
    # A teacher that differs only inside the student's top-k: the k+1 bins hold every difference.
    t = s.clone()
    top = s.topk(5, -1).indices
    t.scatter_(-1, top, s.gather(-1, top) + torch.randn(4, 5, generator=g))
    t_lp = torch.log_softmax(t, -1)
    p_t, p_s = t_lp.exp(), torch.softmax(s, -1)
    bins_t = torch.cat([p_t.gather(-1, top), 1 - p_t.gather(-1, top).sum(-1, keepdim=True)], -1)
    bins_s = torch.cat([p_s.gather(-1, top), 1 - p_s.gather(-1, top).sum(-1, keepdim=True)], -1)
    want = (bins_t * (bins_t / bins_s).log()).sum(-1)
    assert torch.allclose(divergence(s, t_lp, "forward_kl", estimator="topk", top_k=5), want, atol=1e-5)


def test_sampled_estimator_value_is_the_log_ratio_and_gradient_the_score_function():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(5, 30, generator=g, dtype=torch.float64, requires_grad=True)
    t_lp = torch.log_softmax(torch.randn(5, 30, generator=g, dtype=torch.float64), -1)
    x = torch.randint(0, 30, (5,), generator=g)
    got = divergence(s, t_lp, "reverse_kl", estimator="sampled", sampled=x)
    s_lp = torch.log_softmax(s, -1)
    ratio = (s_lp.gather(-1, x[:, None]) - t_lp.gather(-1, x[:, None]))[:, 0]
    assert torch.allclose(got, ratio.detach())
    got.sum().backward()
    s2 = s.detach().clone().requires_grad_(True)
    surrogate = (ratio.detach() * torch.log_softmax(s2, -1).gather(-1, x[:, None])[:, 0]).sum()
    surrogate.backward()
    assert torch.allclose(s.grad, s2.grad)
    # Averaged over samples from the student it estimates KL(student || teacher).
    probs = torch.softmax(s.detach()[0], -1)
    draws = torch.multinomial(probs, 20000, replacement=True, generator=g)
    estimate = divergence(s.detach()[0].expand(20000, -1), t_lp[0].expand(20000, -1), "reverse_kl",
                          estimator="sampled", sampled=draws).mean()
    assert estimate.item() == pytest.approx(naive("reverse_kl", s.detach()[:1], t_lp[:1])[0].item(), abs=0.05)
    with pytest.raises(FicError, match="reverse_kl only"):
        divergence(s, t_lp, "forward_kl", estimator="sampled", sampled=x)


def test_the_trust_region_bounds_each_tokens_pull_and_is_exact_when_wide():
    g = torch.Generator().manual_seed(0)
    student = torch.log_softmax(torch.randn(6, 50, generator=g), -1)
    teacher = torch.log_softmax(3 * torch.randn(6, 50, generator=g), -1)
    assert torch.allclose(trust_region(teacher, student, 1e3), teacher, atol=1e-6)
    bounded = trust_region(teacher, student, 0.5)
    ratio = bounded - student
    assert torch.allclose(bounded.exp().sum(-1), torch.ones(6))
    assert float((ratio.max(-1).values - ratio.min(-1).values).max()) <= 1.0 + 1e-5  # a shift of a [-c, c] clip
    assert divergence(student, bounded, "forward_kl").sum() < divergence(student, teacher, "forward_kl").sum()


class TwoTerms(torch.nn.Module):
    """Two loss terms on one weight: `a` on the rows of x, `b` on the rows of y, each a sum."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x, y):
        return {"a": self.linear(x).pow(2).sum(), "b": self.linear(y).tanh().sum()}


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_each_terms_own_gradient_norm_is_that_terms_gradient_and_the_step_is_unchanged():
    """Two micro-batches, term b absent from the second: grad_norm_<term> is the norm of
    weight * term / its count over the window, computed alone; the gradients the optimizer reads
    equal those of a window that measured nothing."""
    from accelerate import Accelerator

    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(2, 3, generator=g), "y": torch.randn(1, 3, generator=g)},
               {"x": torch.randn(3, 3, generator=g), "y": torch.zeros(0, 3)}]
    counts = [{"a": 2, "b": 1}, {"a": 3, "b": 0}]
    weights = {"a": 0.5, "b": 2.0}
    torch.manual_seed(0)
    measured, plain = TwoTerms(), TwoTerms()
    plain.load_state_dict(measured.state_dict())
    reference = [TwoTerms() for _ in weights]
    for model in reference:
        model.load_state_dict(measured.state_dict())

    figures = window_backward(Accelerator(gradient_accumulation_steps=2), measured, [dict(b) for b in batches],
                              counts, weights, term_norms=True)
    window_backward(Accelerator(gradient_accumulation_steps=2), plain, [dict(b) for b in batches], counts, weights)
    for a, b in zip(measured.parameters(), plain.parameters()):
        assert torch.equal(a.grad, b.grad)
    for (name, weight), model in zip(weights.items(), reference):
        total = sum(count[name] for count in counts)
        (weight * sum(model(**batch)[name] for batch in batches) / total).backward()
        want = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
        assert figures[f"grad_norm_{name}"] == pytest.approx(want, rel=1e-6) and want > 0
    assert "grad_norm_a" not in window_backward(Accelerator(gradient_accumulation_steps=2), plain,
                                                [dict(b) for b in batches], counts, weights)
