"""Perturbed numerics for ``make nbval-perturbed``: run at the start of every notebook kernel.

A printed figure must not depend on round-off, or the same notebook prints other digits on
another CPU (an Intel AVX-512 and AMX machine against an AMD one, say) and strict nbval fails
there. Round-off cannot be chosen on purpose, but its effect can be imitated: this file,
loaded as an IPython start-up file before the first cell, multiplies every floating-point
number that PyTorch draws at random (initial weights and random inputs alike) by
``1 + u``, with ``u`` uniform in ``[-1e-6, 1e-6]``: a few units in the last place of float32,
the size of the differences another CPU's kernels make. Every gradient an optimiser is
about to use is nudged likewise, with ``u`` up to ``1e-3``: round-off comes back at every
training step (a perturbation of the initial weights alone fades while training
converges), and a training run carries a difference in its last bit to a different last
printed digit by chance, so the nudge is made large enough that a figure which can change
does change on a typical run, not only on an unlucky one. It can only move what training
produced, and a figure read off training is a bound or not compared anyway (the rule in
CONTRIBUTING.md). A figure that survives all this does not depend on round-off; one that
changes (a loss after training, an accuracy counted over a trained model, the last digit
of a long sum) fails nbval here, on any machine.

What it leaves alone, on purpose:

- the random stream: the perturbation is drawn from a generator of its own, so every
  ``torch.manual_seed`` still gives the same integers (data order, dropout masks, sampled
  tokens) as in the committed run;
- integers (``randint``, ``randperm``, ``multinomial``, ``bernoulli``) and half-precision
  tensors (float16 and bfloat16 cannot hold a change of 1e-6).

It also plays one CPU whose kernel is missing: ATen's portable build on an AMX CPU has no
bfloat16 ``scaled_dot_product_attention`` (``pack_vnni2 is only supported when avx512 is
supported``), so here every bfloat16 call of it on the CPU raises that error. A chapter that
shows bfloat16 attention on the CPU must say what happens where that kernel is missing.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _disable_current_modes

RELATIVE = float(os.environ.get("COURSE_PERTURB_RELATIVE", "1e-6"))
GRADIENTS = float(os.environ.get("COURSE_PERTURB_GRADIENTS", "1e-3"))
_NOISE = torch.Generator().manual_seed(20261126)
_rand = torch.rand  # the original, for the noise itself
_PERTURBED = (torch.float32, torch.float64)


def _nudge(tensor: torch.Tensor, relative: float = RELATIVE) -> torch.Tensor:
    """Multiply ``tensor`` in place by ``1 + u``, ``u ~ U(-relative, relative)``.

    Out of sight of any dispatch mode: the nudge stands for another CPU's rounding, not for
    operators of the notebook's, so a cell that counts operators (chapters 9 and 11, with a
    ``TorchDispatchMode``) counts the same here as anywhere."""
    if isinstance(tensor, torch.Tensor) and tensor.dtype in _PERTURBED and tensor.numel() \
            and tensor.device.type != "meta":
        with torch.no_grad(), _disable_current_modes():
            noise = _rand(tensor.shape, generator=_NOISE, dtype=tensor.dtype)  # CPU
            tensor.mul_(1 + relative * (2 * noise.to(tensor.device) - 1))
    return tensor


def _after(function):  # a function that returns a new random tensor
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        return _nudge(function(*args, **kwargs))
    return wrapped


def _in_place(method):  # a Tensor method that fills its tensor at random
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        return _nudge(method(self, *args, **kwargs))
    return wrapped


def _nudge_gradients(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                _nudge(param.grad, GRADIENTS)


def _without_cpu_bfloat16(sdpa):
    @functools.wraps(sdpa)
    def wrapped(query, key, value, *args, **kwargs):
        if isinstance(query, torch.Tensor) and query.device.type == "cpu" \
                and query.dtype == torch.bfloat16:
            raise RuntimeError("pack_vnni2 is only supported when avx512 is supported "
                               "(played by tools/perturbed/perturb_numerics.py)")
        return sdpa(query, key, value, *args, **kwargs)
    return wrapped


for _name in ("randn", "rand", "randn_like", "rand_like", "normal"):
    setattr(torch, _name, _after(getattr(torch, _name)))
for _name in ("normal_", "uniform_"):  # nn.init's initialisers all end in one of these
    setattr(torch.Tensor, _name, _in_place(getattr(torch.Tensor, _name)))
register_optimizer_step_pre_hook(_nudge_gradients)
F.scaled_dot_product_attention = _without_cpu_bfloat16(F.scaled_dot_product_attention)
os.environ["COURSE_PERTURBED"] = RELATIVE.__repr__()
