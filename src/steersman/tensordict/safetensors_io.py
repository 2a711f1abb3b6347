"""``to_safetensors`` / ``from_safetensors``: a TensorDict as one ``.safetensors`` file.

The tensors are the file's entries (named by their keys joined with ``"."``, the
``state_dict`` convention); the nesting, batch sizes, dim names and JSON-able non-tensor
values go in the file's ``__metadata__`` as JSON. Loading reads tensors and JSON only:
it never executes code. A plain safetensors file (no steersman metadata, e.g. a
Hugging Face checkpoint) loads as a nested TensorDict split on ``"."``, with empty batch
sizes, ready for :meth:`~steersman.tensordict.TensorDictBase.to_module`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .base import TensorDictBase, is_tensor_collection
from .nontensor import is_non_tensor
from .td import TensorDict

__all__ = ["to_safetensors", "from_safetensors"]

_KEY = "steersman.tensordict"
_VERSION = 1


def _safetensors() -> Any:
    try:
        import safetensors.torch as st
    except ImportError as err:
        raise ImportError("to_safetensors/from_safetensors need the 'safetensors' package: "
                          "pip install safetensors") from err
    return st


def _encode(td: TensorDictBase, prefix: tuple, tensors: dict[str, torch.Tensor]) -> dict:
    entries: dict[str, Any] = {}
    for key, value in td.items():
        path = (*prefix, key)
        if is_non_tensor(value):
            data = value.data
            try:
                json.dumps(data)
            except (TypeError, ValueError):
                raise TypeError(f"to_safetensors: the non-tensor entry {path} holds a "
                                f"{type(data).__name__}, which is not JSON; only tensors and "
                                "JSON values can be saved") from None
            entries[key] = {"value": data}
        elif is_tensor_collection(value):
            if not isinstance(value, TensorDict):
                value = value.to_tensordict()
            entries[key] = _encode(value, path, tensors)
        elif isinstance(value, torch.Tensor):
            name = ".".join(path)
            while name in tensors:  # a key with a "." in it collides with a nested one
                name += "_"
            tensors[name] = value.detach().to("cpu").contiguous()
            entries[key] = {"tensor": name}
        else:
            raise TypeError(f"to_safetensors: entry {path} is a {type(value).__name__}, not a tensor")
    return {"batch_size": list(td.batch_size), "names": td.names_or_none(), "entries": entries}


def to_safetensors(data: TensorDictBase, path: str | Path) -> None:
    """Saves ``data`` (a TensorDict, nested, with JSON-able non-tensor values) to a
    ``.safetensors`` file that :func:`from_safetensors` reads back with its structure.

    Tensors are copied to CPU; tensors sharing memory are saved as separate copies.

    Example:
        >>> import tempfile, torch
        >>> from steersman.tensordict import TensorDict, from_safetensors, to_safetensors
        >>> td = TensorDict(obs=torch.ones(2, 3), sub=TensorDict(b=torch.zeros(2), batch_size=[2]),
        ...                 batch_size=[2])
        >>> td["tag"] = "run-1"
        >>> f = tempfile.mkdtemp() + "/td.safetensors"
        >>> to_safetensors(td, f)
        >>> back = from_safetensors(f)
        >>> back.batch_size, back["sub", "b"].shape, back["tag"]
        (torch.Size([2]), torch.Size([2]), 'run-1')
    """
    st = _safetensors()
    if not is_tensor_collection(data):
        raise TypeError(f"to_safetensors: expected a TensorDict, got {type(data).__name__}")
    td = data if isinstance(data, TensorDict) else data.to_tensordict()
    tensors: dict[str, torch.Tensor] = {}
    root = _encode(td, (), tensors)
    meta = {_KEY: json.dumps({"version": _VERSION, "root": root})}
    try:
        st.save_file(tensors, str(path), metadata=meta)
    except RuntimeError as err:
        if "share memory" not in str(err) and "shared" not in str(err):
            raise
        st.save_file({k: v.clone() for k, v in tensors.items()}, str(path), metadata=meta)


def _decode(level: dict, f: Any, device: Any, path: Any, where: tuple) -> TensorDict:
    try:
        out = TensorDict(batch_size=level["batch_size"], device=device)
        for key, e in level["entries"].items():
            if "tensor" in e:
                out.set(key, f.get_tensor(e["tensor"]).to(device) if device is not None
                        else f.get_tensor(e["tensor"]))
            elif "value" in e:
                out.set_non_tensor(key, e["value"])
            else:
                out.set(key, _decode(e, f, device, path, (*where, key)))
        if level.get("names") is not None:
            out.names = level["names"]
    except Exception as err:  # a malformed file: name it and where (KeyError, SafetensorError...)
        raise ValueError(f"from_safetensors: {str(path)!r}: the tensordict metadata at {where or 'the root'} "
                         f"does not match the file's tensors: {err}") from err
    return out


def from_safetensors(path: str | Path, *, device: Any = None) -> TensorDict:
    """Loads a ``.safetensors`` file as a TensorDict (without executing any code).

    A file written by :func:`to_safetensors` comes back with its nesting, batch sizes,
    dim names and non-tensor values; any other safetensors file gives a nested
    TensorDict of its tensors (keys split on ``"."``, batch size ``[]``).

    Args:
        path: the file.

    Keyword Args:
        device: where to put the tensors (default: CPU).

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> f = tempfile.mkdtemp() + "/model.safetensors"
        >>> save_file(torch.nn.Linear(3, 4).state_dict(), f)
        >>> params = from_safetensors(f)
        >>> params["weight"].shape, params.batch_size
        (torch.Size([4, 3]), torch.Size([]))
    """
    st = _safetensors()
    if not Path(path).is_file():
        raise FileNotFoundError(f"from_safetensors: no file {str(path)!r}")
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(_KEY)
        if raw is None:
            out = TensorDict(device=device)
            for name in f.keys():
                out.set(tuple(name.split(".")), f.get_tensor(name))
            return out if device is None else out.to(device)
        meta = json.loads(raw)
        if meta.get("version") != _VERSION:
            raise ValueError(f"from_safetensors: {str(path)!r} has tensordict metadata version "
                             f"{meta.get('version')!r}; this steersman reads version {_VERSION}")
        del st
        return _decode(meta["root"], f, device, path, ())
