"""Peak memory of a conversion stays near the largest source tensor (not the checkpoint)."""

import json
import subprocess
import sys
import textwrap

from safetensors.torch import save_file

from tests.tiny_checkpoints import build


def test_peak_memory_is_bounded_by_the_largest_tensor(tmp_path):
    """A checkpoint whose vocabulary matrices dominate: 2 x 64 MiB bf16 plus many small
    tensors. Peak anonymous memory during conversion must stay within a few times the largest
    tensor in float32 (128 MiB), far below what holding the checkpoint would take."""
    import torch

    src = build(tmp_path / "ckpt", moe=False)
    config = json.loads((src / "config.json").read_text())
    vocab, hidden = 262144, 128
    config["vocab_size"] = vocab
    (src / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file

    sd = load_file(src / "model.safetensors")
    sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    sd["model.embed_tokens.weight"] = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    sd["lm_head.weight"] = torch.randn(vocab, hidden, dtype=torch.bfloat16)
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    del sd
    largest_f32 = vocab * hidden * 4
    script = textwrap.dedent(
        f"""
        import threading, time, json
        from pathlib import Path

        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
            return 0

        peak = [0]
        stop = threading.Event()
        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], anon())
                time.sleep(0.002)
        from ninfer_convert.pipeline import convert
        import torch
        base = anon()
        t = threading.Thread(target=sample); t.start()
        convert("qwen3_6_27b", {{"base": {str(src)!r}}}, Path({str(tmp_path / "m.ninfer")!r}))
        stop.set(); t.join()
        print(json.dumps({{"base": base, "peak": peak[0]}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    growth = result["peak"] - result["base"]
    checkpoint_f32 = 2 * largest_f32
    print(f"peak growth {growth / 2**20:.0f} MiB, largest tensor f32 {largest_f32 / 2**20:.0f} MiB")
    assert growth < 3 * largest_f32, (growth, largest_f32)
    assert growth < 2.5 * checkpoint_f32
