"""``Choice``: a spec whose value is drawn from one of several specs or fixed non-tensor values."""

from __future__ import annotations

from typing import Any

import torch

from steersman.tensordict import is_non_tensor

from .base import ShapeLike, TensorSpec, _equal

__all__ = ["Choice"]


def _data(x: Any) -> Any:
    return x.data if is_non_tensor(x) and hasattr(x, "data") else x


class Choice(TensorSpec):
    """One of several specs (or fixed non-tensor values), picked at random by ``rand``.

    Args:
        choices: a non-empty list of :class:`TensorSpec` of one class, shape, dtype and
            device, or a list of :class:`~steersman.tensordict.NonTensorData` of one shape
            (e.g. the instructions a goal-conditioned env may give).

    ``rand`` picks a choice uniformly and returns its ``rand`` (a spec) or the value
    itself (non-tensor data); ``zero`` uses the first choice and ``one`` the second (the
    first when there is one choice). ``is_in`` is true when any choice accepts the value
    (for non-tensor data: when it equals one of them). ``project`` is not defined (no
    unique nearest choice) and raises ``NotImplementedError``.

    Example:
        >>> import torch
        >>> from steersman.data import Bounded, Choice
        >>> spec = Choice([Bounded(0.0, 1.0, shape=(1,)), Bounded(10.0, 11.0, shape=(1,))])
        >>> x = spec.rand()
        >>> bool((x < 1).all() or (x >= 10).all()), spec.is_in(torch.tensor([5.0]))
        (True, False)
        >>> from steersman.tensordict import NonTensorData
        >>> words = Choice([NonTensorData(w) for w in ["left", "right"]])
        >>> words.rand().data in ("left", "right"), words.is_in(NonTensorData("up"))
        (True, False)
    """

    domain = "choice"

    def __init__(self, choices: list) -> None:
        if not isinstance(choices, list) or not choices:
            raise TypeError(f"Choice needs a non-empty list of choices; got {type(choices).__name__}")
        first = choices[0]
        if not (isinstance(first, TensorSpec) or is_non_tensor(first)):
            raise TypeError(f"each choice must be a TensorSpec or NonTensorData; choice 0 is a {type(first).__name__}")
        for i, c in enumerate(choices[1:], 1):
            if type(c) is not type(first):
                raise TypeError(f"all choices must be of one type: choice 0 is a {type(first).__name__}, "
                                f"choice {i} a {type(c).__name__}")
            for attr in ("shape", "dtype", "device"):
                if attr == "shape" and is_non_tensor(c):
                    a, b = c.batch_size, first.batch_size
                else:
                    a, b = getattr(c, attr, None), getattr(first, attr, None)
                if a != b:
                    raise ValueError(f"all choices must share their {attr}: choice 0 has {b}, choice {i} has {a}")
        self._is_spec = isinstance(first, TensorSpec)
        shape = first.shape if self._is_spec else first.batch_size
        super().__init__(shape, device=first.device, dtype=first.dtype if self._is_spec else None)
        self._choices = [c.clone() for c in choices]

    @property
    def num_choices(self) -> int:
        """How many choices the spec holds."""
        return len(self._choices)

    def _pick(self, i: int, shape: ShapeLike, how: str) -> Any:
        c = self._choices[i]
        return getattr(c, how)(shape) if self._is_spec else c

    def rand(self, shape: ShapeLike = None) -> Any:
        return self._pick(int(torch.randint(len(self._choices), ())), shape, "rand")

    def zero(self, shape: ShapeLike = None) -> Any:
        return self._pick(0, shape, "zero")

    def one(self, shape: ShapeLike = None) -> Any:
        return self._pick(min(1, len(self._choices) - 1), shape, "one")

    def is_in(self, val: Any) -> bool:
        if self._is_spec:
            return any(c.is_in(val) for c in self._choices)
        return any(_equal(_data(c), _data(val)) for c in self._choices)

    def _check(self, val: Any) -> str | None:
        return None if self.is_in(val) else f"{val!r} matches none of the {len(self._choices)} choices"

    def project(self, val: Any) -> Any:
        raise NotImplementedError("Choice.project: there is no unique nearest choice to project onto")

    def cardinality(self) -> int:
        """Number of distinct values: the sum over spec choices, or the number of data choices."""
        if not self._is_spec:
            return len(self._choices)
        return sum(int(c.cardinality()) for c in self._choices)

    def _map(self, fn: Any) -> Choice:
        if not self._is_spec:
            raise NotImplementedError("shape operations on a Choice of non-tensor data are not supported")
        return Choice([fn(c) for c in self._choices])

    def expand(self, *shape: Any) -> Choice:
        return self._map(lambda c: c.expand(*shape))

    def unsqueeze(self, dim: int) -> Choice:
        return self._map(lambda c: c.unsqueeze(dim))

    def squeeze(self, dim: int | None = None) -> Choice:
        return self._map(lambda c: c.squeeze(dim))

    def reshape(self, *shape: Any) -> Choice:
        return self._map(lambda c: c.reshape(*shape))

    def to(self, dest: Any) -> Choice:
        return self._map(lambda c: c.to(dest)) if self._is_spec else self

    def clone(self) -> Choice:
        return Choice(list(self._choices))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Choice) and other.num_choices == self.num_choices
                and all(_equal(a, b) if not isinstance(a, TensorSpec) else a == b
                        for a, b in zip(self._choices, other._choices)))

    __hash__ = None  # type: ignore[assignment]

    def _repr_fields(self) -> list[str]:
        return [f"choices={self._choices!r}"]
