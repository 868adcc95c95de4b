"""Compile every CUDA kernel family for sm_90a with NVRTC, without a GPU.

A development aid for machines with no device: NVRTC only needs its shared library, which the
``nvidia-cuda-nvrtc`` wheel ships. Point ``NVRTC_LIB`` at ``libnvrtc.so.13`` (default: the one
in the installed wheel) and run ``python scripts/check_kernels.py [--resources] [--cache]
[family ...]``. ``--resources`` also prints each kernel's registers and spill bytes (ptxas's
report): the occupancy a change costs, before any GPU runs it. ``--cache`` writes each cubin
into the kernel cache (``NINFER_KERNEL_CACHE``) under the key a GPU machine's first start
looks up, so a cache built here with the GPU machine's NVRTC version seeds a fresh machine
(``scripts/gpu-check.sh`` unpacks ``.kcache-carry/kcache.tar.gz``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_runtime.backends.cuda import compile as C


def _library() -> ctypes.CDLL:
    path = os.environ.get("NVRTC_LIB")
    if path is None:
        import nvidia.cu13  # type: ignore[import-not-found]

        path = str(Path(next(iter(nvidia.cu13.__path__))) / "lib" / "libnvrtc.so.13")
    for builtins in Path(path).parent.glob("libnvrtc-builtins.so.*"):
        if ".alt." not in builtins.name:  # NVRTC opens it by name: load it first
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


class NvrtcError(Exception):
    pass


class Nvrtc:
    """The few NVRTC calls ``compile.compile_nvrtc`` makes, over ctypes."""

    NVRTCError = NvrtcError

    def __init__(self) -> None:
        self.lib = _library()

    def _check(self, status: int) -> None:
        if status:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise NvrtcError(self.lib.nvrtcGetErrorString(status).decode())

    def getVersion(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return major.value, minor.value

    def createProgram(
        self, source: str, name: str, headers: tuple, includes: tuple
    ) -> ctypes.c_void_p:
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(prog), source.encode(), name.encode(), 0, None, None
            )
        )
        return prog

    def addNameExpression(self, prog: ctypes.c_void_p, name: str) -> None:
        self._check(self.lib.nvrtcAddNameExpression(prog, name.encode()))

    def compileProgram(self, prog: ctypes.c_void_p, options: tuple[str, ...]) -> None:
        arr = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        self._check(self.lib.nvrtcCompileProgram(prog, len(options), arr))

    def getProgramLog(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")

    def getCUBIN(self, prog: ctypes.c_void_p) -> bytes:
        size = ctypes.c_size_t()
        self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetCUBIN(prog, buf))
        return buf.raw

    def getPTX(self, prog: ctypes.c_void_p) -> bytes:
        size = ctypes.c_size_t()
        self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)
        self._check(self.lib.nvrtcGetPTX(prog, buf))
        return buf.raw

    def getLoweredName(self, prog: ctypes.c_void_p, name: str) -> str:
        out = ctypes.c_char_p()
        self._check(self.lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)))
        return out.value.decode()

    def destroyProgram(self, prog: ctypes.c_void_p) -> None:
        self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def resources(nvrtc: Nvrtc, family: str) -> list[str]:
    """``name: registers, spills`` for each kernel of ``family``, from ptxas's verbose log."""
    names = C.FAMILIES[family]
    prog = nvrtc.createProgram(C.family_source(family), "ninfer_kernels.cu", (), ())
    try:
        for name in names:
            nvrtc.addNameExpression(prog, name)
        nvrtc.compileProgram(prog, (*C.OPTIONS, "-arch=sm_90a", "--ptxas-options=-v"))
        log = nvrtc.getProgramLog(prog)
        readable = {nvrtc.getLoweredName(prog, n): n for n in names}
    finally:
        nvrtc.destroyProgram(prog)
    lines, current, spills = [], None, ""
    for line in log.splitlines():
        if "Compiling entry function" in line:
            current = readable.get(line.split("'")[1], line.split("'")[1])
        elif "spill stores" in line:
            spills = line.split(".", 1)[1].strip()
        elif "Used" in line and "registers" in line and current:
            used = line.split("Used", 1)[1].split(",")[0].strip()
            lines.append(f"     {current}: {used}, {spills}")
            current = None
    return lines


def main(families: list[str]) -> int:
    import importlib
    import pkgutil

    import ninfer_runtime.backends.cuda as package

    for info in pkgutil.iter_modules(package.__path__):  # launchers register their families
        # a module that needs CuPy at import launches no kernel family
        with contextlib.suppress(ImportError):
            importlib.import_module(f"{package.__name__}.{info.name}")
    show, cache = "--resources" in families, "--cache" in families
    families = [f for f in families if not f.startswith("--")]
    nvrtc = Nvrtc()
    failed = 0
    for family in families or sorted(C.FAMILIES):
        source, names = C.family_source(family), C.FAMILIES[family]
        try:
            if cache:
                image, _ = C._compile_cached(source, list(names), "sm_90a", nvrtc)
            else:
                image, _ = C._nvrtc_program(nvrtc, source, names, "-arch=sm_90a", cubin=True)
        except C.CompileError as exc:
            failed += 1
            print(f"FAIL {family}\n{exc}")
        else:
            print(f"ok   {family}: {len(image)} bytes")
            if show:
                print("\n".join(resources(nvrtc, family)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
