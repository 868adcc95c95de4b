"""The op catalogue's registry: every policy row names a registered provider, every
provider's module defines its function and its accepts function (imported where the provider
runs on the CPU, read without importing where it needs CuPy or a GPU library), resolution
follows the policy and skips providers that are not installed or decline the key, overrides
win, and a bad name is one clear error."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest

from ninfer_runtime.ops import registry
from ninfer_runtime.ops.attention import policy as attention_policy
from ninfer_runtime.ops.attention.reference import TOLERANCE as ATTENTION_TOLERANCE
from ninfer_runtime.ops.delta_rule import policy
from ninfer_runtime.ops.delta_rule.reference import TOLERANCE
from ninfer_runtime.ops.linear import policy as linear_policy
from ninfer_runtime.ops.linear.reference import TOLERANCE as LINEAR_TOLERANCE
from ninfer_runtime.ops.moe import policy as moe_policy
from ninfer_runtime.ops.moe.reference import TOLERANCE as MOE_TOLERANCE
from ninfer_runtime.ops.norm import policy as norm_policy
from ninfer_runtime.ops.norm.reference import TOLERANCE as NORM_TOLERANCE
from ninfer_runtime.ops.sampling import policy as sampling_policy
from ninfer_runtime.ops.sampling.reference import TOLERANCE as SAMPLING_TOLERANCE

#: the linear family's rows: its policy orders providers by layout, M and size, so every
#: order it gives is a row
LINEAR_ROWS = {
    ("product", "cpu"): linear_policy.choose("product", device="cpu"),
    **{
        ("product", f"cuda code={code} m={m} weights={w}"): linear_policy.choose(
            "product", device="cuda", code=code, m=m, weights=w
        )
        for code in (*linear_policy.TENSOR_CORES_FROM, -1)
        for m in (1, 2, 4, 8, 9, 64)
        for w in (1, 1 << 30)
    },
    **{
        ("matmul", f"{device} capturing={capturing}"): names
        for (device, capturing), names in linear_policy.MATMUL.items()
    },
}
#: family -> (its policy table, its providers' stated tolerances)
FAMILIES = {
    "delta_rule": (policy.TABLE, TOLERANCE),
    "attention": (attention_policy.TABLE, ATTENTION_TOLERANCE),
    "sampling": (sampling_policy.TABLE, SAMPLING_TOLERANCE),
    "linear": (LINEAR_ROWS, LINEAR_TOLERANCE),
    "moe": (moe_policy.TABLE, MOE_TOLERANCE),
    "norm": (norm_policy.TABLE, NORM_TOLERANCE),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_policy_row_names_registered_providers(family: str) -> None:
    table = registry.providers(family)
    rows, tolerance = FAMILIES[family]
    for (op, *_device_and_size), names in rows.items():
        assert names, (family, op)
        for name in names:
            assert name in table[op], f"{family}.{op}: {name} is not registered"
            assert name in tolerance, f"{family}.{op}: {name} states no tolerance"


def _parsed(module: str) -> tuple[importlib.machinery.ModuleSpec, ast.Module]:
    """A module's spec and its source's syntax tree, without running it."""
    spec = importlib.util.find_spec(module)  # imports the parent packages only
    assert spec is not None and spec.origin, f"{module}: no such module"
    return spec, ast.parse(Path(spec.origin).read_text(), spec.origin)


def defined_names(module: str) -> set[str]:
    """Top-level names a module's source defines or imports, read without running it."""
    spec, tree = _parsed(module)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            source = importlib.util.resolve_name(relative, spec.parent)
            for alias in node.names:
                # a name re-exported from our own code must exist where it comes from
                if source.startswith("ninfer_"):
                    assert _provides(source, alias.name), f"{module}: {source} has no {alias.name}"
                names.add(alias.asname or alias.name)
    return names


def _provides(source: str, name: str) -> bool:
    """Whether module ``source`` defines ``name`` or, a package, has a submodule of that name
    (looked for as a file: ``source`` itself is not imported)."""
    if name in _source_names(source):
        return True
    spec = importlib.util.find_spec(source)
    folders = (spec.submodule_search_locations or []) if spec else []
    return any((Path(f) / f"{name}.py").is_file() or (Path(f) / name).is_dir() for f in folders)


def _source_names(module: str) -> set[str]:
    _, tree = _parsed(module)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
    return found


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_provider_module_defines_its_functions(family: str) -> None:
    for op, table in registry.providers(family).items():
        for name, provider in table.items():
            what = f"{family}.{op} {name}"
            wanted = {provider.function} | ({provider.accepts} if provider.accepts else set())
            if not provider.requires:  # runs on the CPU: it imports and its functions exist
                module = importlib.import_module(provider.module)
                for fn in wanted:
                    assert callable(getattr(module, fn, None)), f"{what}: no {fn}"
            else:  # needs CuPy or a GPU library: its source names them
                missing = wanted - defined_names(provider.module)
                assert not missing, f"{what}: {provider.module} does not define {missing}"


def test_cpu_resolves_the_reference_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.INFO, logger="ninfer.ops"),
        registry.override("delta_rule", "chunk", "reference"),
    ):
        fn = registry.resolve("delta_rule", "chunk", device="cpu", key_dim=8, value_dim=8)
    assert "delta_rule.chunk" in caplog.text and "reference" in caplog.text
    rng = np.random.default_rng(0)
    t, h, d = 5, 2, 8
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    state = np.zeros((h, d, d), np.float32)
    out = fn(q, q, q, -np.ones((t, h), np.float32), np.full((t, h), 0.5, np.float32), state)
    assert out.shape == (t, h, d) and np.abs(state).max() > 0  # the state was written


def absent() -> str:
    return "absent"


def picky() -> str:
    return "picky"


def plain() -> str:
    return "plain"


def picky_accepts(*, rows: int, **_: object) -> bool:
    return rows >= 64


def plain_accepts(**_: object) -> bool:
    return True


def test_policy_skips_providers_that_are_absent_or_decline() -> None:
    registry.family("test_family", lambda op, **key: ("absent", "picky", "plain"))
    for name, requires in (("absent", ("no_such_library_xyz",)), ("picky", ()), ("plain", ())):
        registry.register(
            registry.Provider(
                "test_family", "op", name, __name__, name, requires,
                "picky_accepts" if name == "picky" else "plain_accepts",
            )
        )  # fmt: skip
    assert registry.resolve("test_family", "op", rows=128)() == "picky"
    assert registry.resolve("test_family", "op", rows=8)() == "plain"
    with registry.override("test_family", "op", "absent"), pytest.raises(LookupError):
        registry.resolve("test_family", "op", rows=128)
    # on a machine without CuPy the CUDA row falls through to the reference
    if importlib.util.find_spec("cupy") is None:
        fn = registry.resolve("delta_rule", "chunk", device="cuda", key_dim=128, value_dim=128)
        assert fn is registry.providers("delta_rule")["chunk"]["reference"].load()


def test_a_resolution_is_memoised_and_an_override_or_a_patch_takes_effect_at_once() -> None:
    key = {"device": "cpu", "key_dim": 8, "value_dim": 8}
    first = registry.resolve("delta_rule", "chunk", **key)
    assert registry.resolve("delta_rule", "chunk", **key) is first
    assert registry.resolve("delta_rule", "chunk", value_dim=8, key_dim=8, device="cpu") is first
    registry.family("memo_family", lambda op, **key: ("picky", "plain"))
    for name in ("picky", "plain"):
        registry.register(
            registry.Provider("memo_family", "op", name, __name__, name, (), f"{name}_accepts")
        )
    assert registry.resolve("memo_family", "op", rows=128)() == "picky"  # now memoised
    with registry.override("memo_family", "op", "plain"):
        assert registry.resolve("memo_family", "op", rows=128)() == "plain"
        with registry.patched("memo_family", "op", lambda: "patched"):
            assert registry.resolve("memo_family", "op", rows=128)() == "patched"
        assert registry.resolve("memo_family", "op", rows=128)() == "plain"
    assert registry.resolve("memo_family", "op", rows=128)() == "picky"
    assert registry.resolve("delta_rule", "chunk", **key) is first


def test_recording_gathers_the_ops_resolved_within_it_memoised_or_not() -> None:
    """``recording`` names every op its block resolves, even one memoised before it (the
    memo is dropped on entry), and none resolved outside it."""
    key = {"device": "cpu", "key_dim": 8, "value_dim": 8}
    before = registry.resolve("delta_rule", "chunk", **key)  # memoised outside the block
    registry.resolve("delta_rule", "decode", **key)
    with registry.recording() as seen:
        assert registry.resolve("delta_rule", "chunk", **key) is not None
        registry.resolve("norm", "rms_norm", device="cpu")
    registry.resolve("moe", "block", device="cpu")  # after the block
    assert seen == {("delta_rule", "chunk"), ("norm", "rms_norm")}
    assert registry.resolve("delta_rule", "chunk", **key) is before  # the same provider


def test_unknown_names_are_one_clear_error() -> None:
    with pytest.raises(LookupError, match="no op family 'nope'"):
        registry.resolve("nope", "chunk", device="cpu")
    with pytest.raises(LookupError, match="no policy row"):
        registry.resolve("delta_rule", "chunk", device="tpu")
    with (
        registry.override("delta_rule", "chunk", "missing"),
        pytest.raises(LookupError, match="names no provider 'missing'"),
    ):
        registry.resolve("delta_rule", "chunk", device="cpu")


def test_ninfer_log_level_info_prints_each_ops_provider(tmp_path) -> None:
    import subprocess
    import sys

    from ninfer_convert.pipeline import convert
    from tests.bundled import BUNDLED

    artifact = tmp_path / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, artifact)
    run = subprocess.run(
        [sys.executable, "-c", "from ninfer_runtime.cli import main; main()", str(artifact),
         "--prompt", "Hello", "--max-tokens", "2", "--log-level", "info"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "delta_rule.chunk device=cpu" in run.stderr and "-> reference" in run.stderr


def test_attention_prefill_reference_is_the_gathered_attention() -> None:
    from ninfer_runtime.backends.array_ops import attention

    fn = registry.resolve(
        "attention", "prefill", device="cpu", precision="float32", head_dim=8, storage="float32"
    )
    rng = np.random.default_rng(1)
    pages = np.array([2, 0, 1])
    k_pages, v_pages = (rng.standard_normal((3, 4, 2, 8)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    out = fn(q, k_pages, v_pages, pages, start=6, scale=0.3, precision="float32")
    k = k_pages[pages].reshape(-1, 2, 8)[:9]
    v = v_pages[pages].reshape(-1, 2, 8)[:9]
    np.testing.assert_allclose(out, attention(q, k, v, 6, 0.3), rtol=1e-6)


def test_linear_policy_names_registered_providers_and_puts_tiles_first() -> None:
    table = registry.providers("linear")["product"]
    for code in linear_policy.TENSOR_CORES_FROM:
        for m in (1, 2, 8, 9, 64):
            names = linear_policy.choose("product", device="cuda", code=code, m=m, weights=1 << 26)
            assert names[0] == "tiles" and set(names) <= set(table), names
    assert linear_policy.choose("product", device="cpu") == ("reference",)
    with pytest.raises(LookupError, match="no policy row"):
        linear_policy.choose("product", device="tpu", code=0, m=1, weights=1)


def test_a_product_of_arrays_is_ours_inside_a_capture_and_the_librarys_outside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ops.linear.matmul`` keys its resolution by the device and, on a GPU, whether the
    stream is capturing (the strict device answers as CuPy's stream does); the policy puts
    ours first only inside a capture, and the product is numpy's either way here."""
    from ninfer_runtime.ops import linear
    from tests.strict_device import DeviceArray, capturing

    assert linear_policy.choose("matmul", device="cuda", capturing=True)[0] == "nvrtc"
    assert linear_policy.choose("matmul", device="cuda")[0] == "reference"
    assert linear_policy.choose("matmul", device="cpu") == ("reference",)
    keys = []

    def recorded(family: str, op: str, **key: object) -> object:
        keys.append(key)
        return registry.resolve(family, op, **key)

    monkeypatch.setattr(linear, "resolve", recorded)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 2))
    np.testing.assert_array_equal(linear.matmul(a, b), a @ b)
    device_a, device_b = a.view(DeviceArray), b.view(DeviceArray)
    with capturing():
        np.testing.assert_array_equal(np.asarray(linear.matmul(device_a, device_b)), a @ b)
    np.testing.assert_array_equal(np.asarray(linear.matmul(device_a, device_b)), a @ b)
    assert keys == [
        {"device": "cpu", "capturing": False},
        {"device": "cuda", "capturing": True},
        {"device": "cuda", "capturing": False},
    ]


def test_a_bulk_prefill_takes_the_bulk_row_and_a_small_one_the_plain_row() -> None:
    bulk, plain = policy.TABLE[("prefill", "cuda", "bulk")], policy.TABLE[("prefill", "cuda")]
    assert bulk != plain
    heads = 48
    rows = -(-policy.BULK_PREFILL // heads)  # the fewest rows that make a bulk call
    assert policy.size_class("prefill", rows, heads) == "bulk"
    assert policy.size_class("prefill", rows - 1, heads) == ""
    assert policy.size_class("decode", 1 << 20, heads) == ""  # only a prefill has a size
    assert policy.choose("prefill", device="cuda", size="bulk") == bulk
    assert policy.choose("prefill", device="cuda", size="") == plain
    assert policy.choose("prefill", device="cpu", size="bulk") == ("reference",)
