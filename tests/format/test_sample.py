import numpy as np
from click.testing import CliRunner

from ninfer_format import Artifact
from ninfer_format.inspect_cli import main as inspect_main
from ninfer_format.sample import main as sample_main
from ninfer_format.verify import verify


def test_sample_is_valid_strict_and_binds(tmp_path):
    path = tmp_path / "s.ninfer"
    result = CliRunner().invoke(sample_main, [str(path)])
    assert result.exit_code == 0, result.output
    with Artifact.open(path) as art:
        assert art.binder_report.ok and not art.binder_report.warnings
        report = verify(art, strict=True)
        assert report.ok and not report.warnings
        formats = {o.format for o in art.objects.values() if o.kind == "tensor"}
        assert {
            "q4_g64_fp16",
            "q5_g64_fp16",
            "q6_g64_fp16",
            "q8_g32_fp16",
            "nvfp4",
            "fp8_e4m3fn_row_bf16",
            "nf4_g64_fp16",
            "bf16",
            "fp32",
        } <= formats
        q = art.parameter("text/layers/1/attention/query")
        assert q.shape == (256, 256) and np.isfinite(q).all() and q.std() > 0
    result = CliRunner().invoke(inspect_main, [str(path), "--strict"])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(sample_main, [str(path)]).exit_code == 1  # refuses to overwrite
