"""CuPy's host/device refusals on numpy, so the CUDA paths' discipline is tested on a CPU.

Model code is written once on ``backend.xp`` and does some work on the host on purpose (numpy);
on the CUDA backend every mix of the two is an error, which the CPU backend (numpy both sides)
never shows. Here the "device" is numpy too, but its arrays are ``DeviceArray``s and its module
``xp`` refuses host arrays as CuPy 13/14 do (``cupy/_core``: ``_kernel._preprocess_arg``,
``ndarray.__array_ufunc__``/``__array_function__``/``__array__``, ``_scatter_op``):

* a device function (``xp.f``, or a numpy function given a device array, which CuPy dispatches
  to ``cupy.f``) refuses a host ``numpy.ndarray`` (0-d too) anywhere in its arguments, nested in
  lists and tuples as ``concatenate`` takes them: ``TypeError: Unsupported type``. Python and
  numpy scalars pass. ``asarray``, ``array`` and ``asanyarray`` are the host->device copy and
  take host arrays and lists; split points, shapes, axes and ``take``'s indices may be host
  arrays (CuPy reads them on the host or copies them), as may the ``*_like`` creators' model
  (``HOST_PARAMETERS``);
* an operator or ufunc with a device operand refuses a host operand (comparisons take a 0-d
  one, as CuPy's workaround for numpy#12142 does);
* ``device[basic index] = host array`` (or a list) raises ``ValueError`` (CuPy's ``fill``
  refuses non-scalar host values); an advanced index (integer or boolean arrays, lists), host
  or device, is copied to the device and its assignment takes host values, as CuPy's does;
* a device array is no integer (``operator.index`` refuses, as a CuPy array has no
  ``__index__``): ``range(x)`` and slices bounded by a device scalar fail; ``int(x)``,
  ``float(x)``, ``bool(x)``, ``x.item()``, ``x.tolist()`` and iteration work (they synchronise);
* ``refusing_implicit_copies()``: within it ``np.asarray``, ``np.array``, ``np.asanyarray`` and
  ``np.ascontiguousarray`` refuse device arrays (CuPy's ``__array__`` raises); host reads go
  through ``DeviceArray.get()`` (``to_numpy``). A numpy subclass cannot refuse numpy's C-level
  conversions, so this patches those four names on the ``numpy`` module: calls written
  ``np.asarray(...)`` are caught, ``from numpy import asarray`` and numpy's own internals are
  not;
* ``capturing()``: within it what a CUDA graph's capture refuses raises (a copy from the host:
  ``asarray`` and its kin given anything but a device array; a read back: ``get``, ``item``,
  ``tolist``, ``int``, ``float``, ``bool``; a function CuPy runs with a wait for the device:
  ``SYNCHRONISING``, sorts and counts), as ``strict_cuda``'s captured steps run, and
  ``xp.cuda.get_current_stream().is_capturing()`` is true.

Not emulated (a numpy subclass can't, or it is not worth inventing):

* a host array indexed by a device array (``host[device]``) or assigned one (``host[i] =
  device``): numpy reads the subclass as one of its own (CuPy raises from ``__array__``);
* lists of Python numbers given to device functions other than the creators: accepted here,
  CuPy refuses most; ``xp.copy(host)`` returns a host array on CuPy, a device one here;
* numpy's C methods on a device array that return host results or read a second array
  unchecked: ``nonzero``, ``argmax``, ``argmin``, ``searchsorted`` and ``dot`` are wrapped as
  device functions, others may remain;
* ``ninfer_runtime.arrays.host_copy`` of a device array is a device array here (CuPy's is
  pinned host memory); functions CuPy lacks run here; dtypes follow numpy's promotion.

The backend on these arrays, and what the CUDA kernels would refuse, is ``tests/strict_cuda.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["DeviceArray", "refuse_host_arrays", "refusing_implicit_copies", "xp"]

#: numpy's conversions as imported, before ``refusing_implicit_copies`` patches them
_CONVERSIONS = ("asarray", "array", "asanyarray", "ascontiguousarray")
_NUMPY = {name: getattr(np, name) for name in _CONVERSIONS}
#: device functions that take host arrays anywhere: the host->device copy
TAKES_HOST = frozenset({"asarray", "array", "asanyarray"})
#: (position, keyword) of device functions' parameters that CuPy reads on the host or copies
#: to the device itself: split points, shapes, axes, ``take``'s indices and the array whose
#: shape and dtype the ``*_like`` creators copy
HOST_PARAMETERS: dict[str, tuple[int, str]] = {
    "split": (1, "indices_or_sections"),
    "array_split": (1, "indices_or_sections"),
    "reshape": (1, "shape"),
    "broadcast_to": (1, "shape"),
    "tile": (1, "reps"),
    "transpose": (1, "axes"),
    "take": (1, "indices"),
    **{name: (0, "shape") for name in ("empty", "zeros", "ones", "full")},
    **{name: (0, "a") for name in ("empty_like", "zeros_like", "ones_like", "full_like")},
}
#: device functions CuPy runs with a wait for the device (a sort's library call, a count read
#: back to size the result), which a CUDA graph's capture refuses
SYNCHRONISING = frozenset({"argsort", "sort", "unique", "nonzero", "argwhere", "flatnonzero"})
#: ufuncs to which CuPy hands a 0-d host operand as a Python scalar (numpy#12142)
COMPARISONS = frozenset({"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"})


def _device_method(name: str) -> Any:
    """``x.name(...)`` as the device function ``np.name(x, ...)`` (see ``DeviceArray``)."""

    def method(self: DeviceArray, *args: Any, **kwargs: Any) -> Any:
        return _call(getattr(np, name), name, (self, *args), kwargs)

    method.__name__ = name
    return method


class DeviceArray(np.ndarray):
    """A "device" array: numpy underneath, CuPy's manners on top (see the module docstring)."""

    def get(self) -> np.ndarray:
        """The host copy (``cupy.ndarray.get``)."""
        _refuse_in_capture(f"a read of a device array {self.shape} back to the host")
        return self.view(np.ndarray).copy()

    def item(self, *args: Any) -> Any:
        _refuse_in_capture("item() of a device array")
        return super().item(*args)

    def tolist(self) -> Any:
        _refuse_in_capture("tolist() of a device array")
        return super().tolist()

    def __int__(self) -> int:
        _refuse_in_capture("int() of a device array")
        return int(self.view(np.ndarray))

    def __float__(self) -> float:
        _refuse_in_capture("float() of a device array")
        return float(self.view(np.ndarray))

    def __bool__(self) -> bool:
        _refuse_in_capture("bool() of a device array")
        return bool(self.view(np.ndarray))

    def __array_namespace__(self, api_version: str | None = None) -> ModuleType:
        return xp  # type: ignore[return-value]  # what arrays.array_module reads

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out", ())
        zero_d = ufunc.__name__ in COMPARISONS
        refuse_host_arrays(ufunc.__name__, (inputs, out), allow_zero_d=zero_d)
        if out:
            kwargs["out"] = _host_views(out)
        result = getattr(ufunc, method)(*_host_views(inputs), **kwargs)
        return out[0] if len(out) == 1 else _to_device(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _call(func, func.__name__, args, kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        host = next(_hosts(value, lists=True, zero_d=False), None)
        if host is not None and not _advanced(key):
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        super().__setitem__(key, _host_views(value))

    def __index__(self) -> int:
        raise TypeError(f"'{type(self).__name__}' object cannot be interpreted as an integer")

    # numpy's C methods that return host arrays or scalars (CuPy's return device arrays) or
    # read a second array unchecked run as device functions
    nonzero = _device_method("nonzero")
    argmax = _device_method("argmax")
    argmin = _device_method("argmin")
    searchsorted = _device_method("searchsorted")
    dot = _device_method("dot")


class _Stream:
    """CuPy's current stream as far as the runtime asks it: capturing within ``capturing``."""

    def is_capturing(self) -> bool:
        return _CAPTURE["on"]


class _Cuda:
    """``xp.cuda``: CuPy's ``cupy.cuda`` as far as the runtime asks it."""

    @staticmethod
    def get_current_stream() -> _Stream:
        return _Stream()


class _StrictModule:
    """numpy's namespace whose functions are device functions (``_call``); types, constants
    and dtypes pass through, submodules (``xp.linalg``) are strict too; ``xp.cuda`` answers
    whether a step is being captured."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module
        if module is np:
            self.cuda = _Cuda()
        # not "numpy": code that tells the host module by name (ops/delta_rule/loops.py) must
        # see a device one, as it sees "cupy"
        self.__name__ = module.__name__.replace("numpy", "strict_device", 1)

    def __getattr__(self, name: str) -> Any:
        attr = _NUMPY.get(name) if self._module is np else None
        attr = attr if attr is not None else getattr(self._module, name)
        if isinstance(attr, ModuleType):
            return _StrictModule(attr)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def device_function(*args: Any, **kwargs: Any) -> Any:
            return _call(attr, name, args, kwargs)

        device_function.__name__ = name
        setattr(self, name, device_function)  # resolved once
        return device_function

    def __repr__(self) -> str:
        return f"<strict device module over {self._module.__name__}>"


#: the strict device module (``StrictCudaBackend.xp``; a device array's namespace)
xp: Any = _StrictModule(np)


#: whether a step is being captured (``capturing``)
_CAPTURE = {"on": False}


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Within the block the device refuses what a CUDA graph's capture refuses: a copy from
    host memory (``asarray`` and its kin given anything but a device array) and a read back
    (``get``, ``item``, ``tolist``, ``int``, ``float`` or ``bool`` of a device array)."""
    before = _CAPTURE["on"]
    _CAPTURE["on"] = True
    try:
        yield
    finally:
        _CAPTURE["on"] = before


@contextlib.contextmanager
def launching_a_kernel() -> Iterator[None]:
    """Within the block a kernel of the CUDA backend's runs (its reference in its place
    here): a captured step records its launch, which reads nothing back, so the capture's
    refusals are lifted."""
    before = _CAPTURE["on"]
    _CAPTURE["on"] = False
    try:
        yield
    finally:
        _CAPTURE["on"] = before


def _refuse_in_capture(what: str) -> None:
    if _CAPTURE["on"]:
        raise RuntimeError(f"operation not permitted when stream is capturing: {what}")


def _call(fn: Any, name: str, args: Any, kwargs: dict[str, Any]) -> Any:
    """``fn`` as the device function ``name``: host arrays refused unless it takes them, run
    on numpy, its arrays returned as device arrays."""
    if name in TAKES_HOST and not (args and isinstance(args[0], DeviceArray)):
        _refuse_in_capture(f"{name} of host data (a host->device copy)")
    if name in SYNCHRONISING:
        _refuse_in_capture(f"{name} (CuPy waits for the device)")
    if name not in TAKES_HOST:
        position, keyword = HOST_PARAMETERS.get(name, (-1, ""))
        checked_args = [a for i, a in enumerate(args) if i != position]
        refuse_host_arrays(name, (checked_args, {k: v for k, v in kwargs.items() if k != keyword}))
    return _to_device(fn(*_host_views(args), **_host_views(kwargs)))


def refuse_host_arrays(where: str, values: Any, *, allow_zero_d: bool = False) -> None:
    """CuPy's ``TypeError`` for the first host array in ``values`` (nested), if any."""
    for host in _hosts(values, lists=False, zero_d=not allow_zero_d):
        raise TypeError(f"Unsupported type {type(host)} (a host array given to device {where})")


def _hosts(value: Any, *, lists: bool, zero_d: bool) -> Iterator[Any]:
    """Host arrays in ``value`` (in lists, tuples and dict values); ``lists``: a list or tuple
    that holds no device array counts as one; ``zero_d``: 0-d host arrays count."""
    if isinstance(value, DeviceArray):
        return
    if isinstance(value, np.ndarray):
        if zero_d or value.ndim:
            yield value
    elif isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        if lists and not isinstance(value, dict) and not _holds_device(items):
            yield value
            return
        for item in items:
            yield from _hosts(item, lists=lists, zero_d=zero_d)


def _holds_device(items: Iterable[Any]) -> bool:
    return any(
        isinstance(i, DeviceArray) or (isinstance(i, (list, tuple)) and _holds_device(i))
        for i in items
    )


def _advanced(key: Any) -> bool:
    """Whether an index has an advanced part (an array, a list or a bool), which CuPy copies
    to the device and whose assignment takes host values."""
    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(p, (np.ndarray, list, tuple, bool, np.bool_)) for p in parts)


def _host_views(value: Any) -> Any:
    """``value`` with its device arrays seen as plain numpy arrays (same memory)."""
    if isinstance(value, DeviceArray):
        return value.view(np.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_host_views(v) for v in value)
    if isinstance(value, dict):
        return {k: _host_views(v) for k, v in value.items()}
    return value


def _to_device(value: Any) -> Any:
    """Arrays in ``value`` as device arrays, numpy scalars as 0-d ones (a CuPy reduction
    returns a 0-d array)."""
    if isinstance(value, np.ndarray):
        return value if isinstance(value, DeviceArray) else value.view(DeviceArray)
    if isinstance(value, np.generic):
        return _NUMPY["asarray"](value).view(DeviceArray)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_device(v) for v in value)
    return value


@contextlib.contextmanager
def refusing_implicit_copies() -> Iterator[None]:
    """Within the block ``np.asarray`` and its kin refuse device arrays, as CuPy's
    ``__array__`` does (host reads go through ``to_numpy``)."""

    def refusing(name: str) -> Any:
        convert = _NUMPY[name]

        def conversion(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(obj, DeviceArray) or (
                isinstance(obj, (list, tuple)) and _holds_device(obj)
            ):
                raise TypeError(
                    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` "
                    f"to construct a NumPy array explicitly. (np.{name} of a device array)"
                )
            return convert(obj, *args, **kwargs)

        return conversion

    try:
        for name in _CONVERSIONS:
            setattr(np, name, refusing(name))
        yield
    finally:
        for name, convert in _NUMPY.items():
            setattr(np, name, convert)
