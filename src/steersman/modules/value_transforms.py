"""Invertible value transforms: targets are squashed before a value network regresses
them, and predictions mapped back before bootstrapping (MuZero's ``h``, DreamerV3's
``symlog``).

- :func:`symlog` / :func:`symexp`: ``sign(x) log(1 + |x|)`` and its inverse;
- :func:`signed_hyperbolic` / :func:`signed_parabolic`:
  ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` and its inverse;
- modules with ``forward`` and ``inverse``: :class:`ValueTransform` (base),
  :class:`IdentityValueTransform`, :class:`SymLogValueTransform`,
  :class:`SignedHyperbolicValueTransform`, :class:`ComposeValueTransform`.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod

from torch import Tensor, nn

__all__ = [
    "symlog",
    "symexp",
    "signed_hyperbolic",
    "signed_parabolic",
    "ValueTransform",
    "IdentityValueTransform",
    "SymLogValueTransform",
    "SignedHyperbolicValueTransform",
    "ComposeValueTransform",
]


def symlog(value: Tensor) -> Tensor:
    """``sign(x) * log(1 + |x|)``.

    Example:
        >>> import torch
        >>> symlog(torch.tensor([-(torch.e - 1), 0.0, torch.e - 1]))
        tensor([-1.,  0.,  1.])
    """
    return value.sign() * value.abs().log1p()


def symexp(value: Tensor) -> Tensor:
    """``sign(x) * (exp(|x|) - 1)``, the inverse of :func:`symlog`.

    Example:
        >>> import torch
        >>> symexp(symlog(torch.tensor([-5.0, 0.0, 3.0])))
        tensor([-5.,  0.,  3.])
    """
    return value.sign() * value.abs().expm1()


def signed_hyperbolic(value: Tensor, epsilon: float = 1e-3) -> Tensor:
    """``sign(x) * (sqrt(|x| + 1) - 1) + epsilon * x`` (Pohlen et al. 2018).

    Example:
        >>> import torch
        >>> signed_hyperbolic(torch.tensor([-3.0, 0.0, 3.0]), epsilon=0.0)
        tensor([-1.,  0.,  1.])
    """
    return value.sign() * ((value.abs() + 1).sqrt() - 1) + epsilon * value


def signed_parabolic(value: Tensor, epsilon: float = 1e-3) -> Tensor:
    """The inverse of :func:`signed_hyperbolic` (same ``epsilon``).

    Example:
        >>> import torch
        >>> x = torch.tensor([-10.0, 0.0, 2.5])
        >>> torch.allclose(signed_parabolic(signed_hyperbolic(x)), x)
        True
    """
    # |x| = u^2 - 1 where eps u^2 + u - c = 0, c = 1 + eps + |y|; the root is written as
    # 2c / (1 + sqrt(1 + 4 eps c)), which stays accurate in float32 for small eps (and eps=0).
    c = value.abs() + 1 + epsilon
    u = 2 * c / (1 + (1 + 4 * epsilon * c).sqrt())
    return value.sign() * (u.square() - 1)


class ValueTransform(nn.Module, metaclass=ABCMeta):
    """Base class of element-wise invertible value transforms.

    Subclasses implement ``forward`` (raw value -> prediction space) and ``inverse``.

    Example:
        >>> import torch
        >>> class Double(ValueTransform):
        ...     def forward(self, value):
        ...         return 2 * value
        ...     def inverse(self, value):
        ...         return value / 2
        >>> Double().inverse(Double()(torch.tensor([1.0, -3.0])))
        tensor([ 1., -3.])
    """

    @abstractmethod
    def forward(self, value: Tensor) -> Tensor:
        """Maps raw values to the transformed space."""

    @abstractmethod
    def inverse(self, value: Tensor) -> Tensor:
        """Maps transformed values back to raw values."""


class IdentityValueTransform(ValueTransform):
    """Leaves values unchanged (both ways).

    Example:
        >>> import torch
        >>> IdentityValueTransform()(torch.tensor([2.0]))
        tensor([2.])
    """

    def forward(self, value: Tensor) -> Tensor:
        return value

    def inverse(self, value: Tensor) -> Tensor:
        return value


class SymLogValueTransform(ValueTransform):
    """:func:`symlog` forward, :func:`symexp` inverse.

    Example:
        >>> import torch
        >>> t = SymLogValueTransform()
        >>> t.inverse(t(torch.tensor([-100.0, 100.0]))).round()
        tensor([-100.,  100.])
    """

    def forward(self, value: Tensor) -> Tensor:
        return symlog(value)

    def inverse(self, value: Tensor) -> Tensor:
        return symexp(value)


class SignedHyperbolicValueTransform(ValueTransform):
    """:func:`signed_hyperbolic` forward, :func:`signed_parabolic` inverse.

    Args:
        epsilon: the linear term keeping the transform invertible (default ``1e-3``);
            must be ``>= 0``.

    Example:
        >>> import torch
        >>> t = SignedHyperbolicValueTransform(epsilon=0.0)
        >>> t(torch.tensor([8.0]))
        tensor([2.])
    """

    def __init__(self, epsilon: float = 1e-3) -> None:
        super().__init__()
        if epsilon < 0:
            raise ValueError(f"SignedHyperbolicValueTransform: epsilon must be >= 0, got {epsilon}")
        self.epsilon = float(epsilon)

    def forward(self, value: Tensor) -> Tensor:
        return signed_hyperbolic(value, self.epsilon)

    def inverse(self, value: Tensor) -> Tensor:
        return signed_parabolic(value, self.epsilon)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}"


class ComposeValueTransform(ValueTransform):
    """Applies ``transforms`` in order; ``inverse`` undoes them in reverse order.

    Example:
        >>> import torch
        >>> t = ComposeValueTransform(SymLogValueTransform(), SignedHyperbolicValueTransform())
        >>> x = torch.tensor([-7.0, 0.5])
        >>> torch.allclose(t.inverse(t(x)), x)
        True
    """

    def __init__(self, *transforms: ValueTransform) -> None:
        super().__init__()
        for i, t in enumerate(transforms):
            if not isinstance(t, ValueTransform):
                raise TypeError(f"ComposeValueTransform: transform {i} is a {type(t).__name__}, "
                                f"expected a ValueTransform")
        self.transforms = nn.ModuleList(transforms)

    def forward(self, value: Tensor) -> Tensor:
        for t in self.transforms:
            value = t(value)
        return value

    def inverse(self, value: Tensor) -> Tensor:
        for t in reversed(self.transforms):
            value = t.inverse(value)
        return value


