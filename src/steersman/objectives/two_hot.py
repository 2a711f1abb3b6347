"""Symlog squashing and two-hot targets (DreamerV3, Hafner et al. 2023).

``symlog(x) = sign(x) * log(1 + |x|)`` compresses large magnitudes and is inverted by
``symexp(y) = sign(y) * (exp(|y|) - 1)``. A scalar ``x`` is encoded on a sorted support
``bins`` (``[K]``) as the two-hot vector that puts weight on the two neighbouring bins,
linearly interpolated, so that ``sum_k w_k * bins_k = x`` inside the support (values
outside saturate at its ends). A critic predicting logits over ``bins`` is trained with
the cross-entropy to that vector and read out as the softmax expectation.

Example:
    >>> import torch
    >>> bins = torch.tensor([-1.0, 0.0, 1.0])
    >>> two_hot_encode(torch.tensor([0.25]), bins)
    tensor([[0.0000, 0.7500, 0.2500]])
    >>> symlog(torch.tensor([-3.0, 0.0]))
    tensor([-1.3863,  0.0000])
"""

from __future__ import annotations

from ..modules.two_hot import symexp, symlog, two_hot_cross_entropy, two_hot_decode, two_hot_encode

__all__ = ["symlog", "symexp", "two_hot_encode", "two_hot_decode", "two_hot_cross_entropy"]
