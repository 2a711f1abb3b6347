"""``TensorDictSequential``: modules run one after the other on the same TensorDict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from .._utils import NestedKey
from ..td import TensorDict
from .common import (
    TensorDictModuleBase,
    _as_key_list,
    _as_td_module,
    _call_with_tensors,
    _dispatch_aware,
    _Missing,
    _MissingInputKeyError,
    _rollback,
    _snapshot,
)
from .switches import _STATE as _SKIP
from .switches import should_skip

__all__ = ["TensorDictSequential"]


def _hits(key: NestedKey, keys: set) -> bool:
    """``key`` or one of its parents is in ``keys`` (``"agent"`` covers ``("agent", "obs")``)."""
    if key in keys:
        return True
    if type(key) is tuple:
        for i in range(1, len(key)):
            if (key[:i] if i > 1 else key[0]) in keys:
                return True
    return False


def _absent_root(td: Any, key: NestedKey) -> NestedKey | None:
    """The part of ``key`` that is absent from ``td`` (None if ``key`` is present)."""
    if td.get(key, _Missing) is not _Missing:
        return None
    if type(key) is tuple:
        for i in range(1, len(key)):
            prefix = key[:i] if i > 1 else key[0]
            if prefix not in td:
                return prefix
    return key


def _run_partial(module: Any, td: Any, kwargs: dict) -> Any:
    """Runs ``module`` where its inputs exist: on ``td``, or member-wise on a lazy stack."""
    keys = module.in_keys
    if all(k in td for k in keys):
        return module(td, **kwargs)
    members = getattr(td, "tensordicts", None)
    if members is not None:
        for sub in members:
            _run_partial(module, sub, kwargs)
    return td


class TensorDictSequential(TensorDictModuleBase):
    """Runs TensorDict modules in order, each one reading what the previous ones wrote.

    Args:
        *modules: TensorDict modules (plain functions ``td -> td`` are wrapped in
            :class:`WrapModule`).
        partial_tolerant: if ``True``, a module whose inputs are missing is skipped
            instead of raising; on a lazy stack it runs on the members that have its
            inputs (heterogeneous agents).
        selected_out_keys: if given, only these outputs are kept; intermediate outputs
            are removed from the result unless they were already in the input.

    ``in_keys`` are the inputs no earlier module produces; ``out_keys`` every output (the
    last writer's position wins for a key written twice). Indexing returns a module,
    slicing a new sequence; ``len`` counts the modules. A failing module leaves a plain
    ``TensorDict`` input unchanged: the outputs of the modules before it are rolled back.

    Shapes: any batch shape, as the member modules allow.

    Example:
        >>> import torch
        >>> from steersman.tensordict import TensorDict
        >>> from steersman.tensordict.nn import TensorDictModule
        >>> seq = TensorDictSequential(
        ...     TensorDictModule(torch.nn.Linear(3, 8), ["obs"], ["hidden"]),
        ...     TensorDictModule(torch.nn.Linear(8, 2), ["hidden"], ["action"]),
        ... )
        >>> seq.in_keys, seq.out_keys
        (['obs'], ['hidden', 'action'])
        >>> td = seq(TensorDict(obs=torch.randn(4, 3), batch_size=[4]))  # obs [4, 3]
        >>> td["action"].shape  # action [4, 2]
        torch.Size([4, 2])
        >>> seq[1:].in_keys, len(seq)
        (['hidden'], 2)
        >>> seq(obs=torch.randn(3))[1].shape  # keyword call: (hidden, action)
        torch.Size([2])
    """

    def __init__(
        self,
        *modules: Any,
        partial_tolerant: bool = False,
        selected_out_keys: Sequence[NestedKey] | None = None,
        inplace: bool | str | None = None,
    ) -> None:
        super().__init__()
        if not (inplace is None or inplace is True or inplace is False or inplace == "empty"):
            raise ValueError(f"inplace must be True, False, 'empty' or None, got {inplace!r}")
        self.inplace = inplace
        name = type(self).__name__
        if len(modules) == 1 and isinstance(modules[0], (list, tuple, nn.ModuleList)):
            modules = tuple(modules[0])
        mods = [_as_td_module(m, name, i) for i, m in enumerate(modules)]
        self.module = nn.ModuleList(mods)
        self.partial_tolerant = bool(partial_tolerant)
        self._selected: list | None = None
        self._refresh_keys()
        if selected_out_keys is not None:
            self.select_out_keys(*_as_key_list(selected_out_keys, "selected_out_keys"))

    # -- keys ---------------------------------------------------------------------
    def _refresh_keys(self) -> None:
        """Recomputes the cached module list and keys (call after editing ``self.module``)."""
        mods = tuple(self.module)
        self.__dict__["_mods"] = mods
        in_keys: list = []
        out_keys: list = []
        for m in mods:
            for k in m.in_keys:
                if k not in in_keys and k not in out_keys:
                    in_keys.append(k)
            for k in m.out_keys:
                if k in out_keys:
                    out_keys.remove(k)
                out_keys.append(k)
        self._in_keys = in_keys
        self._out_keys_source = [k for k in out_keys if k != "_"]
        self._written = list(self._out_keys_source)
        sel = self._selected
        if sel is not None and not all(k in self._out_keys_source for k in sel):
            sel = self._selected = None
        self._drop = [] if sel is None else [k for k in self._out_keys_source if k not in sel]

    @property
    def in_keys(self) -> list[NestedKey]:
        return self._in_keys

    @property
    def out_keys(self) -> list[NestedKey]:
        if self._selected is None:
            return self._out_keys_source
        return [k for k in self._out_keys_source if k in self._selected]

    @property
    def out_keys_source(self) -> list[NestedKey]:
        """Every output of the modules, selected or not."""
        return self._out_keys_source

    def select_out_keys(self, *out_keys: NestedKey) -> TensorDictSequential:
        """Keeps only ``out_keys`` in the result (returns ``self``, changed in place).

        Other outputs (intermediate results) are removed after the call unless the input
        already held them. :meth:`reset_out_keys` undoes it.
        """
        keys = _as_key_list(list(out_keys), "select_out_keys")
        missing = [k for k in keys if k not in self._out_keys_source]
        if missing:
            raise KeyError(
                f"select_out_keys: {missing} are not outputs of {self._describe()}; "
                f"its outputs are {self._out_keys_source}"
            )
        self._selected = keys
        self._drop = [k for k in self._out_keys_source if k not in keys]
        return self

    def reset_out_keys(self) -> TensorDictSequential:
        """Keeps every output again (undoes :meth:`select_out_keys`)."""
        self._selected = None
        self._drop = []
        return self

    # -- structure ----------------------------------------------------------------
    def _new_sequence(self, modules: Sequence[nn.Module]) -> TensorDictSequential:
        return TensorDictSequential(*modules, partial_tolerant=self.partial_tolerant)

    def __len__(self) -> int:
        return len(self._mods)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return self._new_sequence(self._mods[index])
        return self._mods[index]

    def __iter__(self):
        return iter(self._mods)

    def select_subsequence(
        self,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
    ) -> TensorDictSequential:
        """A new sequence with only the modules linking ``in_keys`` to ``out_keys``.

        With ``in_keys``, the modules kept are those whose output depends on one of these
        keys (directly or through earlier modules). With ``out_keys``, those needed to
        compute one of these keys. Both filters combine. The modules are shared, not
        copied. Raises ``ValueError`` if no module is left.

        Example:
            >>> import torch
            >>> from steersman.tensordict.nn import TensorDictModule
            >>> seq = TensorDictSequential(
            ...     TensorDictModule(lambda x: x + 1, ["x"], ["h"]),
            ...     TensorDictModule(lambda h: h * 2, ["h"], ["y"]),
            ...     TensorDictModule(lambda z: -z, ["z"], ["w"]),
            ... )
            >>> seq.select_subsequence(out_keys=["y"]).out_keys
            ['h', 'y']
            >>> seq.select_subsequence(in_keys=["h"]).in_keys
            ['h']
        """
        mods = list(self._mods)
        if in_keys is not None:
            affected = set(_as_key_list(in_keys, "in_keys"))
            kept = []
            for m in mods:
                if any(_hits(k, affected) for k in m.in_keys):
                    kept.append(m)
                    affected.update(m.out_keys)
            mods = kept
        if out_keys is not None:
            needed = set(_as_key_list(out_keys, "out_keys"))
            kept = []
            for m in reversed(mods):
                if any(_hits(k, needed) for k in m.out_keys):
                    kept.append(m)
                    needed.update(m.in_keys)
            mods = kept[::-1]
        if not mods:
            raise ValueError(
                f"select_subsequence(in_keys={in_keys}, out_keys={out_keys}) leaves no module "
                f"of {self._describe()}; check that the keys are coherent"
            )
        return self._new_sequence(mods)

    # -- call -----------------------------------------------------------------------
    @_dispatch_aware
    def forward(
        self, tensordict: Any = None, *args: Any, tensordict_out: Any = None, **kwargs: Any
    ) -> Any:
        """Runs every module on ``tensordict`` (in place) and returns it.

        With ``tensordict_out``, the modules run on a shallow copy of the input and the
        outputs are written into ``tensordict_out``, which is returned. Called with
        tensors, returns the outputs (a tensor for one output key, else a tuple).
        Extra keyword arguments are passed to every module.
        """
        if not getattr(type(tensordict), "_is_tensor_collection", False):
            pos = args if tensordict is None else (tensordict, *args)
            return _call_with_tensors(
                self, self.forward, pos, kwargs, self._in_keys, self.out_keys
            )
        if _SKIP.active and should_skip(self, tensordict):
            return tensordict
        if args:
            if len(args) > 1 or tensordict_out is not None:
                raise TypeError("forward(tensordict, tensordict_out=None, **kwargs): too many arguments")
            tensordict_out = args[0]
        if tensordict_out is None and self.inplace is not None and self.inplace is not True:
            # inplace=False: the out_keys go to a new TensorDict; "empty": to input.empty()
            tensordict_out = tensordict.empty() if self.inplace == "empty" else TensorDict(
                {}, batch_size=tensordict.batch_size, device=tensordict.device)
        td = tensordict if tensordict_out is None else tensordict.copy()
        drop = None
        if self._drop:
            drop = [r for r in (_absent_root(td, k) for k in self._drop) if r is not None]
        snap = _snapshot(td, self._written) if tensordict_out is None else None
        i = 0
        try:
            if self.partial_tolerant:
                for m in self._mods:
                    td = _run_partial(m, td, kwargs)
                    i += 1
            elif kwargs:
                for m in self._mods:
                    td = m(td, **kwargs)
                    i += 1
            else:
                for m in self._mods:
                    td = m(td)
                    i += 1
        except _MissingInputKeyError as err:
            _rollback(tensordict, snap)
            err.where.append(f"module {i} of {type(self).__name__}")
            raise
        except BaseException:
            _rollback(tensordict, snap)
            raise
        if drop:
            for key in drop:
                if key in td:
                    td.del_(key)
        if tensordict_out is not None:
            keys = [k for k in self.out_keys if k in td]
            tensordict_out.update(td.select(*keys))
            return tensordict_out
        return td

    def _describe(self) -> str:
        return f"{type(self).__name__}(in_keys={self._in_keys}, out_keys={self.out_keys})"

    def extra_repr(self) -> str:
        extra = f"in_keys={self._in_keys}, out_keys={self.out_keys}"
        if self.partial_tolerant:
            extra += ", partial_tolerant=True"
        return extra
