"""``parse_tensor_dict_string``: rebuild a TensorDict's structure from its printed form.

The repr holds keys, shapes, dtypes, devices and batch sizes, not values: the rebuilt
tensors are zeros. Both print layouts are read (the compact default and the one printed
with ``set_printoptions(compact=False)``), and tensordict's own reprs too, so a structure
copied from a log of either library can be reproduced.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import _SHORT_DTYPES

__all__ = ["parse_tensor_dict_string"]

_FROM_SHORT = {v: k for k, v in _SHORT_DTYPES.items()}
_CONTAINERS = ("TensorDict", "LazyStackedTensorDict", "TensorDictParams", "PersistentTensorDict")


class _Parser:
    """A small recursive-descent reader of the repr grammar.

    value := NAME '(' items ')' | NAME '[' dims ']' | '{' items '}' | '[' list ']' | atom
    items := [item (',' item)*]       item := [key (':' | '=')] value
    """

    def __init__(self, s: str) -> None:
        self.s = s
        self.i = 0

    def error(self, what: str) -> ValueError:
        lo = max(0, self.i - 20)
        return ValueError(f"parse_tensor_dict_string: {what} at position {self.i} "
                          f"(near {self.s[lo:self.i + 20]!r})")

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise self.error(f"expected {ch!r}")
        self.i += 1

    def atom(self) -> str:
        self.ws()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] not in ",:=()[]{}" and not self.s[self.i].isspace():
            self.i += 1
        if start == self.i:
            raise self.error("expected a name or a value")
        return self.s[start:self.i]

    def value(self) -> Any:
        c = self.peek()
        if c == "{":
            self.i += 1
            return ("dict", self.items("}"))
        if c == "[":
            self.i += 1
            return ("list", [v for _, v in self.items("]")])
        name = self.atom()
        c = self.peek()
        if c == "(":
            self.i += 1
            return ("call", name, self.items(")"))
        if c == "[":
            self.i += 1
            return ("typed", name, [v for _, v in self.items("]")])
        return name

    def items(self, close: str) -> list:
        out: list = []
        if self.peek() == close:
            self.i += 1
            return out
        while True:
            start = self.i
            key = None
            v = self.value()
            if isinstance(v, str) and self.peek() in (":", "="):
                self.i += 1
                key, v = v, self.value()
            elif not isinstance(v, (str, tuple)):
                self.i = start
                raise self.error("unexpected item")
            out.append((key, v))
            c = self.peek()
            if c == ",":
                self.i += 1
                if self.peek() == close:  # a trailing comma
                    self.i += 1
                    return out
                continue
            if c == close:
                self.i += 1
                return out
            raise self.error(f"expected ',' or {close!r}")


def _ints(node: Any, what: str) -> list[int]:
    if isinstance(node, tuple) and node[0] == "call" and node[1] in ("torch.Size", "Size") and node[2]:
        node = node[2][0][1]
    if not (isinstance(node, tuple) and node[0] == "list"):
        raise ValueError(f"parse_tensor_dict_string: {what} must be a list of ints, got {node!r}")
    try:
        return [int(x) for x in node[1]]
    except (TypeError, ValueError):
        raise ValueError(f"parse_tensor_dict_string: {what} must be a list of ints, got {node[1]!r}") from None


def _dtype(name: str) -> torch.dtype:
    if name in _FROM_SHORT:
        return _FROM_SHORT[name]
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"parse_tensor_dict_string: {name!r} is not a dtype")
    return dt


def _device(name: Any) -> torch.device | None:
    if not isinstance(name, str) or name == "None":
        return None
    return torch.device(name)


def _build(node: Any, outer_bs: list[int] | None) -> Any:
    from .td import TensorDict

    _, head, items = node
    if head not in _CONTAINERS and not head.endswith("TensorDict"):
        raise ValueError(f"parse_tensor_dict_string: {head!r} is not a TensorDict repr")
    kw = {k: v for k, v in items if k is not None}
    if "fields" not in kw:
        raise ValueError(f"parse_tensor_dict_string: the {head} repr has no 'fields'")
    bs = _ints(kw["batch_size"], "batch_size") if "batch_size" in kw else list(outer_bs or [])
    device = _device(kw.get("device"))
    if head == "LazyStackedTensorDict" and "exclusive_fields" in kw and kw["exclusive_fields"][1]:
        raise ValueError("parse_tensor_dict_string: a lazy stack with exclusive keys has no dense structure")
    td = TensorDict({}, batch_size=bs, device=device)
    _fill(td, kw["fields"], bs, device)
    return td


def _fill(td: Any, fields: Any, bs: list[int], device: torch.device | None) -> None:
    from .td import TensorDict

    if not (isinstance(fields, tuple) and fields[0] == "dict"):
        raise ValueError(f"parse_tensor_dict_string: fields must be a {{...}} block, got {fields!r}")
    for key, v in fields[1]:
        if key is None:
            raise ValueError(f"parse_tensor_dict_string: a field without a key: {v!r}")
        if isinstance(v, tuple) and v[0] == "typed":  # compact: f32[4]
            shape = bs + _ints(("list", v[2]), f"the shape of {key!r}")
            td.set(key, torch.zeros(shape, dtype=_dtype(v[1]), device=device))
        elif isinstance(v, tuple) and v[0] == "dict":  # compact nested: {b: f32[]}
            sub = TensorDict({}, batch_size=bs, device=device)
            _fill(sub, v, bs, device)
            td.set(key, sub)
        elif isinstance(v, tuple) and v[0] == "call" and v[1] == "Tensor":
            kw = {k: x for k, x in v[2] if k is not None}
            if "shape" not in kw or "dtype" not in kw:
                raise ValueError(f"parse_tensor_dict_string: the Tensor of {key!r} needs shape and dtype "
                                 "(print it with the default print options)")
            dev = _device(kw.get("device")) or device
            td.set(key, torch.zeros(_ints(kw["shape"], f"the shape of {key!r}"), dtype=_dtype(kw["dtype"]),
                                    device=dev))
        elif isinstance(v, tuple) and v[0] == "call":
            td.set(key, _build(v, bs))
        else:
            what = v if isinstance(v, str) else v[1] if isinstance(v, tuple) and len(v) > 1 else v
            raise ValueError(f"parse_tensor_dict_string: the field {key!r} is a {what!r}, not a Tensor or a "
                             "TensorDict (non-tensor values are not in the repr)")


def parse_tensor_dict_string(s: str) -> Any:
    """Builds a TensorDict with the structure printed in ``s`` (every tensor is zeros).

    A debugging tool: the keys, shapes, dtypes, devices and batch sizes of a printed
    TensorDict are rebuilt, so a structure from a log can be reproduced. Reads the compact
    repr (the default) and the one printed with ``set_printoptions(compact=False)``, from
    steersman or tensordict. In the compact form a nested TensorDict's batch size is not
    printed: it gets its parent's.

    Args:
        s: the repr of a TensorDict (``repr(td)`` / ``print(td)``).

    Returns:
        A new :class:`TensorDict`.

    Raises:
        ValueError: if ``s`` is not such a repr, or a field is neither a tensor nor a
            TensorDict (a non-tensor value is not in the repr), or a lazy stack with
            exclusive keys.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict, parse_tensor_dict_string
        >>> td = TensorDict(obs=torch.ones(3, 4),
        ...                 next=TensorDict(done=torch.ones(3, 1, dtype=torch.bool), batch_size=[3]),
        ...                 batch_size=[3])
        >>> rebuilt = parse_tensor_dict_string(repr(td))
        >>> rebuilt["next", "done"].dtype, rebuilt["obs"].shape, rebuilt.batch_size
        (torch.bool, torch.Size([3, 4]), torch.Size([3]))
        >>> rebuilt["obs"].sum()
        tensor(0.)
    """
    if not isinstance(s, str):
        raise TypeError(f"parse_tensor_dict_string expects a str, got {type(s).__name__}")
    p = _Parser(s.strip())
    node = p.value()
    if p.peek():
        raise p.error("unexpected text after the repr")
    if not (isinstance(node, tuple) and node[0] == "call"):
        raise ValueError(f"parse_tensor_dict_string: not a TensorDict repr: {s[:60]!r}")
    return _build(node, None)
