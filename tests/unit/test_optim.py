"""MultiTensorRowWiseAdagrad: TorchRec's RowWiseAdagrad step for every replicated table at once, bit for bit."""

import pytest
import torch
from torchrec.optim import RowWiseAdagrad

from rayemb.train.worker.optim import MultiTensorRowWiseAdagrad, embedding_optimizer


def _tables(seed: int, shapes):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]


@pytest.mark.parametrize("kwargs", [{"lr": 0.05}, {"lr": 0.05, "eps": 1e-8},
                                    {"lr": 0.05, "weight_decay": 0.01}, {"lr": 0.05, "lr_decay": 0.1}])
def test_same_values_and_state_as_torchrec_bit_for_bit(kwargs):
    shapes = [(3, 16), (200, 16), (1, 16), (57, 8), (9, 8), (5000, 16)]  # two widths; one large (in place)
    ref, fast = _tables(0, shapes), _tables(0, shapes)
    ref_opt, fast_opt = RowWiseAdagrad(ref, **kwargs), MultiTensorRowWiseAdagrad(fast, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        for i, (a, b) in enumerate(zip(ref, fast)):
            g = torch.randn(a.shape, generator=gen)
            if step == 2 and i == 1:
                a.grad = b.grad = None  # a table no batch touched this step: skipped by both
            else:
                a.grad, b.grad = g.clone(), g.clone()
        ref_opt.step()
        fast_opt.step()
        for a, b in zip(ref, fast):
            assert torch.equal(a, b)
    for a, b in zip(ref, fast):
        assert torch.equal(ref_opt.state[a]["sum"], fast_opt.state[b]["sum"])
        assert float(ref_opt.state[a]["step"]) == float(fast_opt.state[b]["step"])
    assert float(fast_opt.state[fast[1]]["step"]) == 3.0  # skipped once


def test_state_dict_loads_into_torchrec_and_back():
    ref, fast = _tables(0, [(5, 4)]), _tables(0, [(5, 4)])
    fast_opt = MultiTensorRowWiseAdagrad(fast, lr=0.1)
    fast[0].grad = torch.ones(5, 4)
    fast_opt.step()
    ref_opt = RowWiseAdagrad(ref, lr=0.1)
    ref_opt.load_state_dict(fast_opt.state_dict())
    assert torch.equal(ref_opt.state[ref[0]]["sum"], fast_opt.state[fast[0]]["sum"])
    assert ref_opt.state[ref[0]]["sum"].shape == (5, 1)


def test_embedding_optimizer_classes():
    assert embedding_optimizer("rowwise_adagrad") is RowWiseAdagrad  # TorchRec maps it onto FBGEMM's fused kernel
    assert embedding_optimizer("rowwise_adagrad", replicated=True) is MultiTensorRowWiseAdagrad
    assert embedding_optimizer("sgd", replicated=True) is torch.optim.SGD
    with pytest.raises(KeyError):
        embedding_optimizer("lamb")


@pytest.mark.parametrize("name", ["rowwise_adagrad", "adagrad", "sgd"])
def test_fp16_rows_step_in_fp32_and_round_to_nearest(name):
    """fp16 replicated rows take the fp32 step of their values, rounded once; untouched rows stay finite (stock
    Adagrad in fp16 turns them to NaN: eps rounds to 0)."""
    cls = embedding_optimizer(name, replicated=True)
    half = [torch.nn.Parameter(t.detach().half()) for t in _tables(0, [(6, 8), (5000, 8)])]
    ref = [torch.nn.Parameter(p.detach().float()) for p in half]
    half_opt, ref_opt = cls(half, lr=0.05), cls(ref, lr=0.05)
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in half]
    grads[0][2:] = 0  # rows no id hit
    for p, r, g in zip(half, ref, grads):
        p.grad, r.grad = g.half(), g.half().float()
    half_opt.step()
    ref_opt.step()
    for p, r in zip(half, ref):
        assert p.dtype == torch.float16 and torch.isfinite(p).all()
        if name == "sgd":  # torch's fp16 add_ computes in fp32 with a fused multiply-add: within one fp16 ulp
            torch.testing.assert_close(p.detach(), r.detach().half(), rtol=2 ** -10, atol=0)
        else:
            assert torch.equal(p, r.detach().half())  # one rounding of the fp32 result
        for key, value in half_opt.state[p].items():
            assert key == "step" or value.dtype == torch.float32, key
