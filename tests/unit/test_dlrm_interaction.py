"""rayemb's DLRM interaction computes exactly what TorchRec's InteractionArch does, gradients included."""

import pytest
import torch
from torchrec.models.dlrm import InteractionArch

from rayemb.models.dlrm import PairwiseDotInteraction


@pytest.mark.parametrize("num_vectors", [1, 2, 26])
def test_pairwise_dot_interaction_matches_torchrecs_interaction_arch(num_vectors):
    torch.manual_seed(num_vectors)
    batch, dim = 33, 16
    dense = torch.randn(batch, dim, dtype=torch.float64, requires_grad=True)
    vectors = [torch.randn(batch, dim, dtype=torch.float64, requires_grad=True) for _ in range(num_vectors)]
    ours = PairwiseDotInteraction(num_vectors)(dense, vectors)
    ref_dense = dense.detach().clone().requires_grad_()
    ref_vectors = [v.detach().clone().requires_grad_() for v in vectors]
    theirs = InteractionArch(num_sparse_features=num_vectors)(ref_dense, torch.stack(ref_vectors, dim=1))
    assert ours.shape == theirs.shape == (batch, dim + (num_vectors + 1) * num_vectors // 2)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    upstream = torch.randn_like(ours)
    ours.backward(upstream)
    theirs.backward(upstream)
    torch.testing.assert_close(dense.grad, ref_dense.grad, rtol=1e-12, atol=1e-12)
    for v, r in zip(vectors, ref_vectors):
        torch.testing.assert_close(v.grad, r.grad, rtol=1e-12, atol=1e-12)


def test_pairwise_dot_interaction_scripts_and_keeps_no_checkpoint_state():
    module = PairwiseDotInteraction(3)
    assert module.state_dict() == {}  # the pair index is rebuilt, never saved
    scripted = torch.jit.script(module)
    dense, vectors = torch.randn(4, 8), [torch.randn(4, 8) for _ in range(3)]
    torch.testing.assert_close(scripted(dense, vectors), module(dense, vectors))
