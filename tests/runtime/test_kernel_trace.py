"""The kernel trace's arithmetic (``ninfer-bench run --profile``) on synthetic kernel events,
and the reading of profiler events into kernels and windows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ninfer_runtime.bench import kernel_trace as K

#: a step: two overlapping kernels, one back to back with the second, a 10 µs gap, a 3 µs gap
STEP = [
    ("void gemv<float>(float const*, float*)", 100.0, 20.0),  # 100-120
    ("void gemv<float>(float const*, float*)", 110.0, 20.0),  # 110-130, overlaps
    ("rms_norm", 130.0, 5.0),  # 130-135, back to back
    ("Memcpy DtoD (Device -> Device)", 145.0, 5.0),  # 150; gap of 10 before it
    ("rms_norm", 153.0, 7.0),  # 153-160; gap of 3 before it
]


def test_busy_intervals_merge_overlapping_and_back_to_back_kernels():
    assert K.busy_intervals(STEP) == [(100.0, 135.0), (145.0, 150.0), (153.0, 160.0)]
    assert K.busy_intervals(list(reversed(STEP))) == K.busy_intervals(STEP)  # any order


def test_summary_counts_span_idle_and_gaps():
    s = K.summarize(STEP)
    assert s.kernels == 5
    assert s.kernel_ms == pytest.approx(0.057)  # 20 + 20 + 5 + 5 + 7 µs, overlap counted twice
    assert s.span_ms == pytest.approx(0.060)  # 100 to 160
    assert s.busy_ms == pytest.approx(0.047)  # 35 + 5 + 7
    assert s.idle_ms == pytest.approx(0.013)  # the gaps of 10 and 3
    assert s.idle_percent == pytest.approx(100 * 13 / 60)
    assert s.gaps_over == 1 and s.largest_gaps_us == pytest.approx((10.0, 3.0))
    assert K.summarize(STEP, gap_us=2.0).gaps_over == 2
    # the 10 µs gap: after the rms_norm that ends at 135 (not the gemv that ended before
    # it), before the copy that starts at 145
    assert s.largest_gap_between == ("rms_norm", "Memcpy DtoD")
    assert K.summarize([("k", 0.0, 1.0)]).largest_gap_between == ()


def test_top_kernels_by_name_ranked_by_time():
    top = K.summarize(STEP, top=2).top
    assert [(k.name, k.count) for k in top] == [("gemv<float>", 2), ("rms_norm", 2)]
    assert top[0].ms == pytest.approx(0.040) and top[1].ms == pytest.approx(0.012)
    names = [k.name for k in K.summarize(STEP).top]
    assert names == ["gemv<float>", "rms_norm", "Memcpy DtoD"]


def test_short_names():
    assert K.short_name("void at::native::fill<128, 4>(int, F)") == "at::native::fill<128, 4>"
    assert K.short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
    assert K.short_name("gdn_decode_f32") == "gdn_decode_f32"
    gemm = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_tn>(Params)"
    assert K.short_name(gemm) == "cutlass::Kernel2<cutlass_80_tensorop_bf16_s1681…"
    assert len(K.short_name(gemm)) == K.NAME_CHARS


def test_an_empty_step_is_zeros():
    s = K.summarize([])
    assert (s.kernels, s.span_ms, s.idle_ms, s.gaps_over, s.top) == (0, 0.0, 0.0, 0, ())
    assert s.idle_percent == 0.0


def test_kernels_split_by_the_window_their_start_falls_in():
    windows = [("decode 1", 200.0, 300.0), ("decode 0", 90.0, 190.0)]
    late = ("late", 250.0, 80.0)  # ends after its window: still that window's
    stray = ("stray", 195.0, 1.0)  # between windows: dropped
    split = K.split_windows([*STEP, late, stray], windows)
    assert split["decode 0"] == STEP and split["decode 1"] == [late]


def test_median_step_is_a_real_step():
    fast = [("k", 0.0, 10.0)]
    mid = [("k", 0.0, 10.0), ("k", 30.0, 10.0)]
    slow = [("k", 0.0, 100.0)]
    assert K.median_step([slow, fast, mid]).span_ms == pytest.approx(0.040)


def test_row_table_and_record_line():
    row = {
        "kind": "kernel trace", "of": "decode", "lanes": 1, "context": 1024, "steps": 3,
        "mode": "CUDA graph replay",
    } | K.as_row(K.summarize(STEP))  # fmt: skip
    text = "\n".join(K.lines(row))
    assert text.startswith(
        "kernel trace, decode step at 1 lane(s), context 1024 (CUDA graph replay; median of 3"
    )
    assert "      5     0.057    0.060    0.013  21.7%            1  10.0, 3.0" in text
    assert "gemv<float>" in text and "66.7%" in text  # 40 µs of a 60 µs span
    line = K.record_line(row)
    assert line.startswith("Kernel trace, decode step at 1 lane(s), context 1024 (CUDA graph")
    assert "5 kernels, 0.057 ms of kernels over a 0.060 ms span, 0.013 ms idle (21.7%)" in line
    assert "the largest gap: after rms_norm, before Memcpy DtoD" in text
    assert (
        "1 gaps > 5 µs (largest 10.0, 3.0 µs), the largest after `rms_norm` and before "
        "`Memcpy DtoD`; top: `gemv<float>` 0.040 ms ×2" in line
    )
    gone = {"kind": "kernel trace", "unavailable": "torch is not installed"}
    assert K.lines(gone) == ["kernel trace unavailable: torch is not installed"]
    assert K.record_line(gone) == "Kernel trace unavailable: torch is not installed."


def test_profiler_events_read_as_kernels_and_windows():
    pytest.importorskip("torch")
    from torch.autograd import DeviceType

    from ninfer_runtime.bench import kernel_profiler as P

    def event(name, device, start, end, kind=None):
        return SimpleNamespace(
            name=name,
            device_type=device,
            time_range=SimpleNamespace(start=start, end=end),
            activity_type=kind,
        )

    window = P.WINDOW_PREFIX + "decode 0"
    events = [
        event(window, DeviceType.CPU, 10.0, 90.0, "user_annotation"),
        event(window, DeviceType.CUDA, 20.0, 60.0, "gpu_user_annotation"),  # its shadow
        event("cudaGraphLaunch", DeviceType.CPU, 11.0, 12.0, "cuda_runtime"),
        event("gemv", DeviceType.CUDA, 20.0, 50.0, "kernel"),
        event("Memset (Device)", DeviceType.CUDA, 50.0, 51.0, "gpu_memset"),
        event("sync", DeviceType.CUDA, 55.0, 56.0, "cuda_sync"),
        event("old_torch_kernel", DeviceType.CUDA, 52.0, 60.0),  # no activity type said
    ]
    kernels, windows = P.device_events(events)
    assert windows == [("decode 0", 10.0, 90.0)]
    assert kernels == [
        ("gemv", 20.0, 30.0),
        ("Memset (Device)", 50.0, 1.0),
        ("old_torch_kernel", 52.0, 8.0),
    ]


def test_the_trace_says_why_it_is_missing_and_never_raises(monkeypatch):
    from ninfer_runtime.bench import kernel_profiler as P

    cpu = SimpleNamespace(backend=SimpleNamespace(xp=SimpleNamespace()))
    assert P.trace_rows(cpu, lanes=1, context=8) == [
        {"kind": "kernel trace", "unavailable": "the CPU backend runs no CUDA kernels"}
    ]
    gpu = SimpleNamespace(backend=SimpleNamespace(xp=SimpleNamespace(cuda=None)))
    reason = P.trace_rows(gpu, lanes=1, context=8)[0]["unavailable"]
    assert reason.startswith(("torch is not installed", "torch sees no CUDA device", "this torch"))
    monkeypatch.setattr(P, "unavailable", lambda runner: None)
    monkeypatch.setattr(P, "_trace", lambda *a: 1 / 0)  # a profiler failing mid-trace
    assert P.trace_rows(gpu, lanes=1, context=8) == [
        {"kind": "kernel trace", "unavailable": "ZeroDivisionError: division by zero"}
    ]


def test_the_trace_runs_each_step_in_a_window_and_retraces_graphs_eagerly(tmp_path, monkeypatch):
    """The decode steps and the prefill chunk run (here on the CPU backend) inside the windows
    the profiler's events are split by; a graph replay whose kernels the profiler missed
    is traced again eagerly, and the backend keeps its graphs."""
    from contextlib import contextmanager

    from ninfer_format import Artifact
    from ninfer_runtime.bench import kernel_profiler as P
    from ninfer_runtime.bench.synthetic import write_synthetic
    from ninfer_runtime.models import load_model
    from ninfer_runtime.runner import ModelRunner

    path = tmp_path / "s.ninfer"
    write_synthetic(path, "tiny_dense", "qwen3_6_27b", seed=1)
    runner = ModelRunner(load_model(Artifact.open(path), "cpu"))
    sessions = []

    def record(work):
        labels = []

        @contextmanager
        def window(label):
            labels.append(label)
            yield

        work(window)
        sessions.append(labels)
        per_window = 1 if len(sessions) == 1 else 40  # a replay's copy alone, then every kernel
        return {label: [("k", 10.0 * i, 5.0) for i in range(per_window)] for label in labels}

    monkeypatch.setattr(P, "record", record)
    monkeypatch.setattr(P, "_keep_cupti_for_graphs", lambda graphs: None)
    monkeypatch.setattr(runner.backend, "graphs", True, raising=False)
    rows = P._trace(runner, 2, 8, 16, 3, "float32")
    decode = ["decode 0", "decode 1", "decode 2"]
    assert sessions == [[*decode, "prefill"], decode]
    assert rows[0]["of"] == "decode" and rows[0]["kernels"] == 40
    assert rows[0]["mode"] == "eager: the profiler saw no kernels inside CUDA graph replays"
    assert rows[1]["of"] == "prefill" and rows[1]["tokens"] == 16 and rows[1]["kernels"] == 1
    assert runner.backend.graphs is True
