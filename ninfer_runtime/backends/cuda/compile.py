"""Compiling the ``kernels/*.cu`` families with NVRTC for the device in use.

Why not ``cupy.RawModule`` alone: it picks the plain ``sm_XY`` target itself, and Hopper's
arch-specific instructions need ``sm_90a``. So each family is compiled here for
``sm_90a`` on a compute-capability-9.0 device and for the device's own ``sm_XY`` elsewhere
(the portable fallback), falling back to PTX when this NVRTC does not know the device.
Cubins are cached on disk by a hash of source, options and NVRTC version, so only the first
process on a machine pays for compilation.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("ninfer.cuda")

KERNEL_DIR = Path(__file__).with_name("kernels")
OPTIONS = ("-std=c++17",)
#: where cubins are kept (``NINFER_KERNEL_CACHE`` overrides)
CACHE_DIR = Path.home() / ".cache/ninfer/kernels"


@functools.cache
def sm_count() -> int:
    """Streaming multiprocessors of the device in use (asked once; launch shapes use it)."""
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def family_source(family: str) -> str:
    """A family's translation unit: the shared decoders, its generated prelude
    (``register_family(..., prelude=)``), the GEMV driver for GEMV families, the families it
    builds on (``needs=``), its headers (``headers=``), then its own file (NVRTC gets one
    string, so no include path is needed)."""
    parts = ["common.cuh"]
    if family.startswith("gemv_"):
        parts.append("gemv.cuh")
    parts += [f"{f}.cu" for f in NEEDS.get(family, ())]
    parts += HEADERS.get(family, ())
    parts.append(f"{family}.cu")
    texts = [(KERNEL_DIR / part).read_text() for part in parts]
    if family in PRELUDES:
        texts.insert(1, PRELUDES[family]())
    return "\n".join(texts)


def target_arch(compute_capability: str) -> str:
    """``sm_90a`` on Hopper (9.0), else the device's own ``sm_XY``."""
    return "sm_90a" if compute_capability == "90" else f"sm_{compute_capability}"


#: kernel family (a ``kernels/<family>.cu`` file) -> the name expressions it instantiates
FAMILIES: dict[str, list[str]] = {}
#: family -> the other families' files its source includes first (their templates)
NEEDS: dict[str, tuple[str, ...]] = {}
#: family -> the headers (``kernels/*.cuh``) its source includes before its own file
HEADERS: dict[str, tuple[str, ...]] = {}
#: family -> a function giving source text generated at run time (tables from a library)
PRELUDES: dict[str, Callable[[], str]] = {}
#: families whose kernels only a captured step launches (a library serves the eager calls),
#: so a step's eager first run never loads them: ``load_capture_only`` does, before a capture
CAPTURE_ONLY: set[str] = set()
_MODULES: dict[str, Module] = {}


def register_family(
    family: str,
    names: Sequence[str],
    *,
    needs: Sequence[str] = (),
    headers: Sequence[str] = (),
    prelude: Callable[[], str] | None = None,
    capture_only: bool = False,
) -> None:
    """Declare a family's kernels; launcher modules call this at import (without CuPy), so
    ``scripts/check_kernels.py`` can compile every family on a machine with no GPU."""
    if needs:
        NEEDS[family] = tuple(needs)
    if headers:
        HEADERS[family] = tuple(headers)
    if prelude is not None:
        PRELUDES[family] = prelude
    if capture_only:
        CAPTURE_ONLY.add(family)
    FAMILIES.setdefault(family, [])
    FAMILIES[family].extend(n for n in names if n not in FAMILIES[family])


#: CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h)
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED = 8
#: dynamic shared memory a launch may take without opting in
DEFAULT_SHARED = 48 << 10


def function(family: str, name: str, *, shared: int = 0) -> Any:
    """A launchable kernel, its family compiled on first use (cubins cached on disk).
    ``shared``: the dynamic shared memory its launches take; above 48 KB the kernel is
    opted in to that much once."""
    module = _MODULES.get(family)
    if module is None:
        module = _MODULES[family] = Module(family, FAMILIES[family])
    return module.function(name, shared)


def load_capture_only() -> None:
    """Loads the families only captured steps launch (``capture_only``), so that no capture
    compiles or loads a module inside it."""
    for family in sorted(CAPTURE_ONLY):
        if family not in _MODULES:
            _MODULES[family] = Module(family, FAMILIES[family])


def compile_all() -> list[str]:
    """Build every registered family now (benchmarks and tests time this separately)."""
    for family in FAMILIES:
        if family not in _MODULES:
            _MODULES[family] = Module(family, FAMILIES[family])
    return sorted(FAMILIES)


class Module:
    """One compiled family: ``module.function("gemv_q4<1>")`` is a launchable kernel."""

    def __init__(self, family: str, names: Sequence[str]):
        import cupy
        from cupy.cuda import function

        self.family = family
        self.arch = target_arch(cupy.cuda.Device().compute_capability)
        start = time.perf_counter()
        source = family_source(family)
        self._functions: dict[str, Any]
        self._shared: dict[str, int] = {}  # kernel -> the dynamic shared memory it may take
        try:
            image, lowered = _compile_cached(source, list(names), self.arch)
        except (AttributeError, TypeError) as exc:  # a CuPy whose NVRTC binding differs
            log.warning("NVRTC binding unusable (%r); compiling with cupy.RawModule", exc)
            self.arch = "cupy default"
            raw = cupy.RawModule(code=source, options=OPTIONS, name_expressions=list(names))
            self._functions = {name: raw.get_function(name) for name in names}
        else:
            self._module = function.Module()
            self._module.load(image)
            self._functions = {name: self._module.get_function(lowered[name]) for name in names}
        log.info(
            "compiled %s (%d kernels, %s) in %.2f s",
            family,
            len(names),
            self.arch,
            time.perf_counter() - start,
        )

    def function(self, name: str, shared: int = 0) -> Any:
        fn = self._functions[name]
        if shared > max(DEFAULT_SHARED, self._shared.get(name, 0)):
            import cupy

            cupy.cuda.driver.funcSetAttribute(fn.ptr, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED, shared)
            self._shared[name] = shared
        return fn


def _compile_cached(
    source: str, names: list[str], arch: str, nvrtc: Any = None
) -> tuple[bytes, dict[str, str]]:
    if nvrtc is None:
        from cupy_backends.cuda.libs import nvrtc

    version = ".".join(str(v) for v in nvrtc.getVersion())
    blob = json.dumps([source, names, arch, OPTIONS, version]).encode()
    key = hashlib.sha256(blob).hexdigest()[:32]
    cache = Path(os.environ.get("NINFER_KERNEL_CACHE", CACHE_DIR))
    image_path, names_path = cache / f"{key}.bin", cache / f"{key}.json"
    if image_path.is_file() and names_path.is_file():
        return image_path.read_bytes(), json.loads(names_path.read_text())
    image, lowered = compile_nvrtc(nvrtc, source, names, arch)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        # names first, each through a rename: a process that sees the image sees whole names
        for path, data in ((names_path, json.dumps(lowered).encode()), (image_path, image)):
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(path)
    except OSError as exc:  # a read-only home only costs recompilation
        log.debug("kernel cache not written: %s", exc)
    return image, lowered


def compile_nvrtc(nvrtc: Any, source: str, names: list[str], arch: str) -> tuple[bytes, dict]:
    """Compile with an NVRTC binding (CuPy's, or a ctypes one in tools): a cubin for
    ``arch``, or PTX for the matching virtual architecture when NVRTC rejects the target."""
    try:
        return _nvrtc_program(nvrtc, source, names, f"-arch={arch}", cubin=True)
    except CompileError as first:
        virtual = "compute_" + arch.removeprefix("sm_").rstrip("a")
        log.warning("NVRTC could not build for %s; trying PTX for %s", arch, virtual)
        try:
            return _nvrtc_program(nvrtc, source, names, f"-arch={virtual}", cubin=False)
        except CompileError:
            raise first from None


def _nvrtc_program(
    nvrtc: Any, source: str, names: list[str], arch_option: str, *, cubin: bool
) -> tuple[bytes, dict[str, str]]:
    prog = nvrtc.createProgram(source, "ninfer_kernels.cu", (), ())
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, (*OPTIONS, arch_option))
        except nvrtc.NVRTCError as exc:
            raise CompileError(f"{exc}\n{nvrtc.getProgramLog(prog)}") from None
        image = nvrtc.getCUBIN(prog) if cubin else nvrtc.getPTX(prog)
        return bytes(image), {name: nvrtc.getLoweredName(prog, name) for name in names}
    finally:
        nvrtc.destroyProgram(prog)


class CompileError(RuntimeError):
    """NVRTC rejected a kernel source (the message holds the compiler log)."""
