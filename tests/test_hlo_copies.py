"""benchmarks/hlo_copies.py: finds the large copies in an optimized HLO dump, with what feeds and uses them."""
from benchmarks import hlo_copies

_HLO = """
ENTRY %main (w: bf16[28,28,128,3584], x: bf16[8,448,1]) -> f32[8,1,3584] {
  %w = bf16[28,28,128,3584]{3,2,1,0} parameter(0)
  %x = bf16[8,448,1]{2,1,0} parameter(1)
  %wrapped_slice = bf16[1,28,128,3584]{3,2,1,0} fusion(%w), kind=kLoop, calls=%wrapped_slice_computation
  %bitcast.1 = bf16[8,448,3584]{2,1,0} bitcast(%wrapped_slice)
  %loop_add_fusion = bf16[1,28,128,3584]{3,2,1,0} fusion(%w), kind=kLoop, calls=%fused_add
  %small = s32[1]{0} copy(%x)
  ROOT %gemm = f32[8,1,3584]{2,1,0} fusion(%x, %bitcast.1), kind=kCustom, calls=%gemm_fusion_dot
}
"""


def test_reports_large_copies_only():
  count, lines = hlo_copies.report(_HLO, min_bytes=4_000_000)
  assert count == 1
  assert lines[0].startswith("25.7 MB  %wrapped_slice = bf16[1,28,128,3584]")
  assert lines[1].startswith("    from: %w = bf16[28,28,128,3584]")
  assert lines[2].startswith("    used by: %bitcast.1 = bf16[8,448,3584]")
  assert not any("%small" in l or "%loop_add_fusion =" in l for l in lines)


def test_main_reads_a_dump_folder(tmp_path, capsys):
  (tmp_path / "module_1.jit__step.sm_9.0a_gpu_after_optimizations.txt").write_text(_HLO)
  hlo_copies.main([str(tmp_path), "--min-mb", "1"])
  assert "1 copies of 1.0 MB or more" in capsys.readouterr().out
