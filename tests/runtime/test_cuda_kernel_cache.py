"""The kernel cache: a compiled image is kept by its source's key, written so that a process
reading beside the writer sees both files whole or neither (no device needed: a stand-in
NVRTC binding)."""

from ninfer_runtime.backends.cuda.compile import _compile_cached


class FakeNvrtc:
    NVRTCError = RuntimeError

    def __init__(self):
        self.compiles = 0

    def getVersion(self):
        return (13, 0)

    def createProgram(self, source, name, headers, includes):
        return {"source": source, "names": []}

    def addNameExpression(self, prog, name):
        prog["names"].append(name)

    def compileProgram(self, prog, options):
        self.compiles += 1

    def getCUBIN(self, prog):
        return prog["source"].encode()

    def getLoweredName(self, prog, name):
        return "_Z" + name

    def destroyProgram(self, prog):
        pass


def test_a_second_compile_of_a_source_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_KERNEL_CACHE", str(tmp_path))
    nvrtc = FakeNvrtc()
    first = _compile_cached("kernel a", ["a"], "sm_90a", nvrtc)
    again = _compile_cached("kernel a", ["a"], "sm_90a", nvrtc)
    other = _compile_cached("kernel b", ["b"], "sm_90a", nvrtc)
    assert first == again == (b"kernel a", {"a": "_Za"})
    assert other == (b"kernel b", {"b": "_Zb"})
    assert nvrtc.compiles == 2
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".bin", ".bin", ".json", ".json"]  # no temporary file left behind
