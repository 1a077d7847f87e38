"""The offline SASS tool: its capture step (any machine) and its loop parser."""
import os

from benchmarks import kernel_sass


def test_capture_writes_each_launch(tmp_path):
  paths = kernel_sass.capture("mix", str(tmp_path / "k"), batch=1, tokens=4096, kv_heads=2, group=7, head_dim=64,
                              config={"int4_launch_min_tokens": 0})
  assert len(paths) == 2  # INT4 pools in a launch of their own
  for path in paths:
    assert "tt.func" in open(path).read()
    assert os.path.exists(path + ".json")


def test_loops_counts_backward_branch_bodies():
  sass = "\n".join([
      "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
      "        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",
      "        /*0020*/                   LDS R2, [R3] ;",
      "        /*0030*/              @P0 BRA 0x10 ;",
      "        /*0040*/                   EXIT ;"])
  [(start, end, ops)] = list(kernel_sass.loops(sass))
  assert (start, end) == (0x10, 0x30)
  assert ops == {"HMMA": 1, "LDS": 1, "BRA": 1}


def test_token_packed_prototype_lowers_for_cuda(tmp_path):
  """The offline prototype (benchmarks/prototype_token_packed_v.py) lowers to Triton IR with its dots."""
  from benchmarks import prototype_token_packed_v as proto

  proto.main(["--warps", "1", "--out", str(tmp_path / "p")])
  ir = (tmp_path / "p.ttir").read_text()
  assert "tt.func" in ir and ir.count("tt.dot") >= 20  # 16 key products (4 tiles x 4 parts) and 4 value ones
  assert "ex2.approx.ftz.f32" in ir and os.path.exists(tmp_path / "p.ttir.json")


def test_ptx_version_lowered_for_the_offline_ptxas():
  """The Mosaic GPU kernel's PTX (ISA 9.0 on the H200) compiles offline under the version pip's ptxas reads;
  nothing else in the text changes."""
  ptx = ".version 9.0\n.target sm_90a\n// .version 9.0 in a comment stays\n.visible .entry k()\n{\n}\n"
  lowered = kernel_sass.ptx_for(ptx, "8.8")
  assert lowered.splitlines()[0] == ".version 8.8"
  assert lowered.splitlines()[1:] == ptx.splitlines()[1:]
