"""TorchRL's Checkpoint API: named components saved and restored through adapters.

A checkpoint is a folder (``format="directory"``) or one ZIP file (``"archive"``)::

    manifest.json                 {"format": "steersman.checkpoint", "version": 1,
                                   "components": {name: {"adapter": id}}, "metadata": {...}}
    components/<name>/...         what the component's adapter wrote

Writes are atomic: the whole checkpoint is written to a hidden temp sibling, every file
fsynced, then renamed into place (an archive with ``os.replace``), so a process killed
mid-write leaves the previous checkpoint loadable. Loading never executes code:
``torch.load(weights_only=True)`` and JSON; a malformed or tampered file raises
:class:`~steersman.tensordict.files.LoadError` naming the file and the field.

Example:
    >>> import tempfile, torch
    >>> source, target = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Checkpoint(policy=source, step=3).save(f"{tmp}/ckpt")
    ...     result = Checkpoint(policy=target).load(f"{tmp}/ckpt")
    >>> result.loaded, torch.equal(source.weight, target.weight)
    ({'policy'}, True)
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import uuid
import warnings
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from steersman.tensordict import TensorDictBase
from steersman.tensordict.files import LoadError, fsync_dir, fsync_file, temp_writer_alive

__all__ = [
    "Checkpoint", "CheckpointAdapter", "CheckpointBest", "CheckpointError", "CheckpointFormat",
    "CheckpointLoadResult", "CheckpointMetricMode", "CheckpointOptions", "CheckpointStrictness",
    "DumpLoadCheckpointAdapter", "GlobalRNGState", "JSONCheckpointAdapter",
    "StateDictCheckpointAdapter", "StateDictFormat", "LoadError",
]

CheckpointFormat = Literal["directory", "archive"]
StateDictFormat = Literal["directory", "archive", "consolidated", "torch"]
CheckpointStrictness = Literal["error", "warn", "ignore"]
CheckpointMetricMode = Literal["min", "max"]
#: ``(metric name in the metadata, "min" or "max")``
CheckpointBest = tuple[str, CheckpointMetricMode]

FORMAT = "steersman.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
#: manifest migrations ``from_version -> callable(manifest) -> manifest of from_version + 1``
_MIGRATIONS: dict[int, Any] = {}


class CheckpointError(RuntimeError):
    """Requested components are missing or incompatible (``strict="error"``).

    ``result`` is the :class:`CheckpointLoadResult` of the attempt.
    """

    def __init__(self, message: str, result: CheckpointLoadResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class CheckpointOptions:
    """Extra positional/keyword arguments for an adapter's ``save`` and ``load``."""

    save_args: tuple[Any, ...] | None = None
    save_kwargs: Mapping[str, Any] | None = None
    load_args: tuple[Any, ...] | None = None
    load_kwargs: Mapping[str, Any] | None = None

    def merged(self, override: CheckpointOptions | None) -> CheckpointOptions:
        """These options with every field ``override`` sets replacing ours (kwargs merged)."""
        if override is None:
            return self

        def kw(a: Mapping | None, b: Mapping | None) -> Mapping | None:
            return b if a is None else a if b is None else {**a, **b}

        return CheckpointOptions(
            override.save_args if override.save_args is not None else self.save_args,
            kw(self.save_kwargs, override.save_kwargs),
            override.load_args if override.load_args is not None else self.load_args,
            kw(self.load_kwargs, override.load_kwargs))


@dataclass
class CheckpointLoadResult:
    """What a load did: components ``loaded``, requested but ``missing`` from the file,
    ``incompatible`` (name -> reason), present but ``unrequested``; ``values`` holds the
    loaded plain (JSON) values, ``manifest`` the checkpoint's manifest."""

    loaded: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    incompatible: dict[str, str] = field(default_factory=dict)
    unrequested: set[str] = field(default_factory=set)
    values: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    comparison: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- RNG
class GlobalRNGState:
    """The global RNG states (torch, numpy, ``random``, CUDA) as a checkpoint component.

    Example:
        >>> rng = GlobalRNGState()
        >>> state = rng.state_dict()
        >>> a = torch.rand(2)
        >>> rng.load_state_dict(state)
        >>> torch.equal(a, torch.rand(2))
        True
    """

    def state_dict(self) -> dict[str, Any]:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        version, internal, py_gauss = random.getstate()
        state = {
            "torch": torch.get_rng_state(),
            "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
            "random": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                       "gauss": py_gauss},
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        for key in ("torch", "numpy", "random"):
            if key not in state_dict:
                raise KeyError(f"GlobalRNGState.load_state_dict: no {key!r} entry "
                               f"(got {sorted(state_dict)})")
        npy, py = state_dict["numpy"], state_dict["random"]
        torch.set_rng_state(state_dict["torch"])
        np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                             npy["has_gauss"], npy["cached_gaussian"]))
        random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


# ----------------------------------------------------------------------------- adapters
class CheckpointAdapter(ABC):
    """Saves one component into a folder and restores it from there."""

    adapter_id: str = "base"
    format_version: int = 1

    @abstractmethod
    def save(self, component: Any, path: Path, *, args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> Any: ...

    @abstractmethod
    def load(self, component: Any, path: Path, *, map_location: Any,
             tensor_load_kwargs: Mapping[str, Any], args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> Any: ...


def _torch_load(file: Path, map_location: Any, extra: Mapping[str, Any]) -> Any:
    try:
        return torch.load(file, map_location=map_location, weights_only=True, **dict(extra))
    except FileNotFoundError:
        raise LoadError(f"{file}: missing", file=file, field=None) from None
    except Exception as e:  # noqa: BLE001 - any unpickling/zip failure is a malformed file
        raise LoadError(f"{file}: not a loadable tensor file ({type(e).__name__}: {e})",
                        file=file, field=None) from e


_TD_TAG = "__tensordict__"


def _to_plain(obj: Any) -> Any:
    """TensorDicts inside a state dict as tagged plain dicts (``weights_only`` loads them)."""
    if isinstance(obj, TensorDictBase):
        return {_TD_TAG: list(obj.batch_size),
                "data": {k: _to_plain(v) for k, v in obj.items()}}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _TD_TAG in obj and set(obj) == {_TD_TAG, "data"}:
            from steersman.tensordict import TensorDict

            return TensorDict({k: _from_plain(v) for k, v in obj["data"].items()},
                              batch_size=obj[_TD_TAG])
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj


class StateDictCheckpointAdapter(CheckpointAdapter):
    """``component.state_dict()`` into ``state.pt``; ``load_state_dict`` on load.

    TensorDicts inside the state are stored as tagged plain dicts and rebuilt on load.

    Every ``payload_format`` is written as one ``torch.save`` file here (read back with
    ``weights_only=True``); the argument is accepted for TorchRL scripts.
    """

    adapter_id = "state_dict"
    state_torch = "state.pt"

    def __init__(self, payload_format: StateDictFormat = "directory", *,
                 archive_compression: str | int | None = None) -> None:
        if payload_format not in ("directory", "archive", "consolidated", "torch"):
            raise ValueError(f"payload_format={payload_format!r}, expected one of "
                             "'directory', 'archive', 'consolidated', 'torch'")
        self.payload_format = payload_format
        self.archive_compression = archive_compression

    def save(self, component: Any, path: Path, *, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        state = _to_plain(component.state_dict(*args, **dict(kwargs or {})))
        torch.save(state, path / self.state_torch)

    def load(self, component: Any, path: Path, *, map_location: Any = None,
             tensor_load_kwargs: Mapping[str, Any] | None = None, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> Any:
        state = _torch_load(path / self.state_torch, map_location, tensor_load_kwargs or {})
        try:
            state = _from_plain(state)
        except (TypeError, ValueError, RuntimeError) as e:
            file = path / self.state_torch
            raise LoadError(f"{file}: malformed TensorDict entry ({e})", file=file,
                            field=_TD_TAG) from None
        return component.load_state_dict(state, *args, **dict(kwargs or {}))


class JSONCheckpointAdapter(CheckpointAdapter):
    """A JSON-compatible value into ``value.json``; ``load`` returns the value."""

    adapter_id = "json"
    state_filename = "value.json"

    def save(self, component: Any, path: Path, *, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            text = json.dumps(component, allow_nan=True)
        except TypeError as e:
            raise TypeError(f"JSONCheckpointAdapter: {type(component).__name__} is not "
                            f"JSON-compatible ({e})") from None
        (path / self.state_filename).write_text(text)

    def load(self, component: Any, path: Path, *, map_location: Any = None,
             tensor_load_kwargs: Mapping[str, Any] | None = None, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> Any:
        return _read_json(path / self.state_filename)


class DumpLoadCheckpointAdapter(CheckpointAdapter):
    """``component.dumps(folder)`` / ``component.loads(folder)`` (replay buffers, storages)."""

    adapter_id = "dump_load"

    def save(self, component: Any, path: Path, *, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        component.dumps(path, *args, **dict(kwargs or {}))

    def load(self, component: Any, path: Path, *, map_location: Any = None,
             tensor_load_kwargs: Mapping[str, Any] | None = None, args: tuple[Any, ...] = (),
             kwargs: Mapping[str, Any] | None = None) -> Any:
        return component.loads(path, *args, **dict(kwargs or {}))


_ADAPTERS = {a.adapter_id: a for a in (StateDictCheckpointAdapter, JSONCheckpointAdapter,
                                       DumpLoadCheckpointAdapter)}


def _read_json(file: Path) -> Any:
    try:
        return json.loads(Path(file).read_text())
    except FileNotFoundError:
        raise LoadError(f"{file}: missing", file=file) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoadError(f"{file}: malformed JSON ({e})", file=file) from None


def _is_json_value(obj: Any) -> bool:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return True
    if isinstance(obj, (list, tuple)):
        return all(_is_json_value(x) for x in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _is_json_value(v) for k, v in obj.items())
    return False


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fsync_file(os.path.join(folder, name))
        fsync_dir(folder)


# ----------------------------------------------------------------------------- checkpoint
class Checkpoint:
    """Saves and restores named components (modules, optimizers, buffers, plain values).

    Args:
        format: ``"directory"`` (default) or ``"archive"`` (one ZIP file).
        strict: what a load does about missing/incompatible requested components:
            ``"error"`` (raise :class:`CheckpointError`), ``"warn"`` or ``"ignore"``.
        archive_compression: ``"stored"`` or ``"deflate"`` (archives only).
        save_components: the components a ``save`` writes by default (all when ``None``).
        **components: the named components. Each gets an adapter: ``state_dict`` objects
            the :class:`StateDictCheckpointAdapter`, ``dumps``/``loads`` objects the
            :class:`DumpLoadCheckpointAdapter`, JSON values the :class:`JSONCheckpointAdapter`.
    """

    def __init__(self, *, format: CheckpointFormat = "directory", strict: CheckpointStrictness = "error",
                 archive_compression: str = "stored", save_components: Collection[str] | None = None,
                 **components: Any) -> None:
        _check_choice("format", format, ("directory", "archive"))
        _check_choice("strict", strict, ("error", "warn", "ignore"))
        _check_choice("archive_compression", archive_compression, ("stored", "deflate"))
        self.format = format
        self.strict = strict
        self.archive_compression = archive_compression
        self.save_components = None if save_components is None else list(save_components)
        self._components: dict[str, tuple[Any, CheckpointAdapter, CheckpointOptions]] = {}
        self._type_adapters: dict[type, CheckpointAdapter] = {}
        for name, component in components.items():
            self.register(name, component)

    @property
    def components(self) -> dict[str, Any]:
        return {name: entry[0] for name, entry in self._components.items()}

    def register_adapter(self, component_type: type, adapter: CheckpointAdapter) -> Checkpoint:
        """Use ``adapter`` for components of ``component_type`` registered from now on."""
        self._type_adapters[component_type] = adapter
        return self

    def _adapter_for(self, name: str, component: Any) -> CheckpointAdapter:
        for cls in type(component).__mro__:
            if cls in self._type_adapters:
                return self._type_adapters[cls]
        if hasattr(component, "dumps") and hasattr(component, "loads") and \
                not isinstance(component, TensorDictBase):
            return DumpLoadCheckpointAdapter()
        if hasattr(component, "state_dict") and hasattr(component, "load_state_dict"):
            return StateDictCheckpointAdapter()
        if _is_json_value(component):
            return JSONCheckpointAdapter()
        raise TypeError(f"Checkpoint: component {name!r} ({type(component).__name__}) has no "
                        "state_dict/load_state_dict, no dumps/loads and is not a JSON value; "
                        "pass adapter=")

    def register(self, name: str, component: Any, *, adapter: CheckpointAdapter | None = None,
                 options: CheckpointOptions | None = None) -> Checkpoint:
        """Add (or replace) the component ``name``."""
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"Checkpoint: invalid component name {name!r}")
        adapter = adapter if adapter is not None else self._adapter_for(name, component)
        self._components[name] = (component, adapter, options or CheckpointOptions())
        return self

    def _selected(self, components: Collection[str] | None, default: list[str] | None) -> list[str]:
        names = list(components) if components is not None else \
            (default if default is not None else list(self._components))
        unknown = [n for n in names if n not in self._components]
        if unknown:
            raise KeyError(f"Checkpoint: unknown component(s) {unknown}; registered: "
                           f"{sorted(self._components)}")
        return names

    def save(self, path: str | Path, *, components: Collection[str] | None = None,
             component_options: Mapping[str, CheckpointOptions] | None = None,
             format: CheckpointFormat | None = None,
             metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the selected components (atomically) to ``path``; returns ``path``."""
        path = Path(path)
        fmt = format or self.format
        _check_choice("format", fmt, ("directory", "archive"))
        names = self._selected(components, self.save_components)
        metadata = dict(metadata or {})
        json.dumps(metadata)  # refuse non-JSON metadata before writing anything
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temps(path)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.mkdir()
            manifest = {"format": FORMAT, "version": VERSION, "components": {},
                        "metadata": metadata}
            for name in names:
                component, adapter, options = self._components[name]
                opts = options.merged((component_options or {}).get(name))
                adapter.save(component, tmp / "components" / name, args=opts.save_args or (),
                             kwargs=opts.save_kwargs or {})
                manifest["components"][name] = {"adapter": adapter.adapter_id,
                                                "format_version": adapter.format_version}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
            if fmt == "archive":
                _replace_with_archive(tmp, path, self.archive_compression)
            else:
                _fsync_tree(tmp)
                _replace_dir(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    def load(self, path: str | Path, *, components: Collection[str] | None = None,
             component_options: Mapping[str, CheckpointOptions] | None = None,
             map_location: Any = None, tensor_load_kwargs: Mapping[str, Any] | None = None,
             strict: CheckpointStrictness | None = None) -> CheckpointLoadResult:
        """Restore the selected components from ``path`` (a subset: partial restore).

        ``map_location`` remaps tensors (``"cpu"``, a device, a dict), as in ``torch.load``.
        """
        strict = strict or self.strict
        _check_choice("strict", strict, ("error", "warn", "ignore"))
        path = Path(path)
        names = self._selected(components, None)
        with _opened(path) as root:
            manifest = _read_manifest(root)
            saved = manifest["components"]
            result = CheckpointLoadResult(manifest=manifest)
            result.unrequested = set(saved) - set(names)
            for name in names:
                if name not in saved:
                    result.missing.add(name)
                    continue
                component, _, options = self._components[name]
                adapter_id = saved[name]["adapter"]
                adapter = self._components[name][1]
                if adapter.adapter_id != adapter_id:
                    result.incompatible[name] = (f"saved with adapter {adapter_id!r}, registered "
                                                 f"with {adapter.adapter_id!r}")
                    continue
                opts = options.merged((component_options or {}).get(name))
                try:
                    value = adapter.load(component, root / "components" / name,
                                         map_location=map_location,
                                         tensor_load_kwargs=tensor_load_kwargs or {},
                                         args=opts.load_args or (), kwargs=opts.load_kwargs or {})
                except LoadError:
                    raise
                except (RuntimeError, KeyError, ValueError, TypeError) as e:
                    result.incompatible[name] = f"{type(e).__name__}: {e}"
                    continue
                if isinstance(adapter, JSONCheckpointAdapter):
                    result.values[name] = value
                    self._components[name] = (value, adapter, options)
                result.loaded.add(name)
        problems = sorted(result.missing) + sorted(result.incompatible)
        if problems and strict != "ignore":
            message = (f"{path}: missing components {sorted(result.missing)}, incompatible "
                       f"{result.incompatible}")
            if strict == "error":
                raise CheckpointError(message, result)
            warnings.warn(message, stacklevel=2)
        return result

    @staticmethod
    def register_migration(from_version: int, migration: Any) -> None:
        """Upgrade manifests of ``from_version`` on load: ``migration(manifest)`` returns a
        new manifest whose ``"version"`` is ``from_version + 1`` (payloads stay the
        adapters' business)."""
        if not callable(migration):
            raise TypeError(f"register_migration: migration must be callable, got "
                            f"{type(migration).__name__}")
        _MIGRATIONS[int(from_version)] = migration

    @staticmethod
    def is_checkpoint(path: str | Path) -> bool:
        """Whether ``path`` holds a readable checkpoint manifest."""
        try:
            Checkpoint.manifest(path)
        except (LoadError, OSError):
            return False
        return True

    @staticmethod
    def manifest(path: str | Path) -> dict[str, Any]:
        """The manifest of the checkpoint at ``path`` (components, metadata)."""
        with _opened(Path(path)) as root:
            return _read_manifest(root)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}, expected one of {choices}")


def _read_manifest(root: Path) -> dict[str, Any]:
    file = root / MANIFEST
    manifest = _read_json(file)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise LoadError(f"{file}: not a {FORMAT} manifest", file=file, field="format")
    version = manifest.get("version")
    while isinstance(version, int) and version < VERSION and version in _MIGRATIONS:
        manifest = _MIGRATIONS[version](dict(manifest))
        if not isinstance(manifest, dict) or manifest.get("version") != version + 1:
            raise LoadError(f"{file}: the migration from version {version} did not give a "
                            f"version {version + 1} manifest", file=file, field="version")
        version += 1
    if manifest.get("version") != VERSION:
        raise LoadError(f"{file}: version {manifest.get('version')!r}, expected {VERSION}",
                        file=file, field="version")
    comps = manifest.get("components")
    if not isinstance(comps, dict):
        raise LoadError(f"{file}: 'components' must be an object", file=file, field="components")
    for name, entry in comps.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise LoadError(f"{file}: invalid component name {name!r}", file=file,
                            field="components")
        if not isinstance(entry, dict) or entry.get("adapter") not in _ADAPTERS and \
                not isinstance(entry.get("adapter"), str):
            raise LoadError(f"{file}: components.{name} has no adapter", file=file,
                            field=f"components.{name}")
    if not isinstance(manifest.get("metadata", {}), dict):
        raise LoadError(f"{file}: 'metadata' must be an object", file=file, field="metadata")
    return manifest


def _remove_dead_temps(path: Path) -> None:
    """Delete the temp siblings ``.<name>[.old|.zip].<pid>.<id>.tmp`` of writers that died."""
    for entry in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if not temp_writer_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def _replace_dir(tmp: Path, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        old = path.parent / f".{path.name}.old.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if path.exists():
            raise FileExistsError(f"{path} exists and is not a checkpoint folder")
        os.rename(tmp, path)
    fsync_dir(path.parent)


def _replace_with_archive(tmp: Path, path: Path, compression: str) -> None:
    zpath = path.parent / f".{path.name}.zip.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    mode = zipfile.ZIP_DEFLATED if compression == "deflate" else zipfile.ZIP_STORED
    try:
        with zipfile.ZipFile(zpath, "w", compression=mode) as zf:
            for folder, _, files in os.walk(tmp):
                for name in files:
                    full = Path(folder) / name
                    zf.write(full, full.relative_to(tmp).as_posix())
        fsync_file(zpath)
        os.replace(zpath, path)
        fsync_dir(path.parent)
    finally:
        if zpath.exists():
            zpath.unlink()


class _opened:
    """A checkpoint folder as a folder: itself, or an archive extracted (checked) to a temp."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tmp: Path | None = None

    def __enter__(self) -> Path:
        if self.path.is_dir():
            return self.path
        if not self.path.exists():
            raise FileNotFoundError(f"no checkpoint at {self.path}")
        if not zipfile.is_zipfile(self.path):
            raise LoadError(f"{self.path}: neither a checkpoint folder nor a ZIP archive",
                            file=self.path)
        import tempfile

        self._tmp = Path(tempfile.mkdtemp(prefix="steersman-ckpt-"))
        with zipfile.ZipFile(self.path) as zf:
            for info in zf.infolist():
                parts = Path(info.filename).parts
                if info.filename.startswith("/") or ".." in parts:
                    raise LoadError(f"{self.path}: entry {info.filename!r} escapes the archive",
                                    file=self.path, field=info.filename)
            zf.extractall(self._tmp)
        return self._tmp

    def __exit__(self, *exc: Any) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
