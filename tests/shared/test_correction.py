"""Gradient correction against autograd on the paper's surrogate loss (Appendix A)."""

import pytest
import torch

from shared.correction import correct_gradient


def _bottom_and_batch() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    bottom = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 6))
    return bottom, torch.randn(4, 5)


def _param_grads(bottom: torch.nn.Module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in bottom.parameters() if p.grad is not None]
    bottom.zero_grad()
    return grads


@pytest.mark.parametrize("lam", [0.0, 1e-4, 0.5, 3.0])
def test_matches_autograd_of_the_surrogate_loss(lam: float) -> None:
    """s(w) = ||z - z_hat||^2 + lam/2 ||z - z~||^2 with z_hat = z - g/2 and z~ held fixed."""
    bottom, x = _bottom_and_batch()
    g = torch.randn(4, 6)  # dh/dz~ as party B would return it
    z_tilde = bottom(x).detach() + 0.1 * torch.randn(4, 6)

    z = bottom(x)
    z_hat = z.detach() - g / 2
    surrogate = ((z - z_hat) ** 2).sum() + lam / 2 * ((z - z_tilde) ** 2).sum()
    surrogate.backward()
    expected = _param_grads(bottom)

    z = bottom(x)
    z.backward(correct_gradient(g, z, z_tilde, lam))
    got = _param_grads(bottom)

    for e, o in zip(expected, got, strict=True):
        torch.testing.assert_close(o, e)


def test_chunks_weight_each_clients_surrogate_by_its_share_of_the_step() -> None:
    """A step of two clients (3 rows and 1 row): party B's loss is the mean over all 4 rows,
    the paper's correction is per client on its batch mean, so the step's bottom gradient is
    the n_c/n-weighted sum of the clients' surrogate gradients."""
    bottom, x = _bottom_and_batch()
    lam, rows = 0.7, (3, 1)
    g_client = torch.randn(4, 6)  # d(client's batch-mean loss)/dz~, per row
    z_tilde = bottom(x).detach() + 0.1 * torch.randn(4, 6)
    share = torch.tensor([[0.75]] * 3 + [[0.25]])

    z = bottom(x)
    z_hat = z.detach() - g_client / 2
    per_row = ((z - z_hat) ** 2).sum(1) + lam / 2 * ((z - z_tilde) ** 2).sum(1)
    (per_row[:3].sum() * 0.75 + per_row[3:].sum() * 0.25).backward()
    expected = _param_grads(bottom)

    z = bottom(x)  # what party B sends: the client's gradient times its share of the step
    z.backward(correct_gradient(g_client * share, z, z_tilde, lam, chunk_rows=rows))
    got = _param_grads(bottom)

    for e, o in zip(expected, got, strict=True):
        torch.testing.assert_close(o, e)


def test_one_chunk_is_the_papers_formula_unscaled() -> None:
    g, z, z_tilde = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 3)

    for rows in (None, (5,)):
        got = correct_gradient(g, z, z_tilde, 0.01, chunk_rows=rows)
        torch.testing.assert_close(got, g + 0.01 * (z - z_tilde))


def test_chunk_rows_that_do_not_cover_the_step_are_refused() -> None:
    g = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="do not add up"):
        correct_gradient(g, g, g + 1, 0.1, chunk_rows=(2, 1))


def test_lambda_zero_is_the_straight_through_gradient() -> None:
    bottom, x = _bottom_and_batch()
    top = torch.nn.Linear(6, 3)
    z_tilde = bottom(x).detach().round()  # any fixed quantization

    # straight-through in one graph: forward uses z~, backward passes through to z
    z = bottom(x)
    top(z + (z_tilde - z).detach()).pow(2).sum().backward()
    expected = _param_grads(bottom)

    # split: party B differentiates at z~, party A applies the correction with lambda = 0
    z_t = z_tilde.clone().requires_grad_(True)
    top(z_t).pow(2).sum().backward()
    assert z_t.grad is not None
    z = bottom(x)
    z.backward(correct_gradient(z_t.grad, z, z_tilde, 0.0))
    got = _param_grads(bottom)

    for e, o in zip(expected, got, strict=True):
        torch.testing.assert_close(o, e)


def test_correction_pulls_z_towards_z_tilde() -> None:
    z = torch.zeros(2, 3)
    z_tilde = torch.ones(2, 3)
    g = correct_gradient(torch.zeros(2, 3), z, z_tilde, 0.5)
    # a descent step z - eta * g moves z towards z~
    torch.testing.assert_close(g, torch.full((2, 3), -0.5))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="lambda"):
        correct_gradient(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), -1.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        correct_gradient(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2), 0.1)
