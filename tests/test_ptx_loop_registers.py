"""benchmarks/ptx_loop_registers.py on a small hand-written PTX loop."""
import pytest

from benchmarks import ptx_loop_registers as plr

PTX = """
.visible .entry k(
{
	mov.b64 	%rd1, __dynamic_shmem__0;
	add.s64 	%rd2, %rd1, 256;        // hoisted address: live in
	mov.b32 	%r1, 0;                 // the loop counter: carried
	mov.f32 	%f1, 0f00000000;        // an accumulator: carried
	mov.b32 	%r9, 7;                 // used only after the loop
$L__BB0_1:
	ld.shared.f32 	%f2, [%rd2];
	add.f32 	%f1, %f1, %f2;
	add.s32 	%r1, %r1, 1;
	setp.lt.s32 	%p1, %r1, 10;
	@%p1 bra 	$L__BB0_1;
	st.global.f32 	[%rd1], %f1;
	add.s32 	%r2, %r9, 1;
	ret;
}
"""


def test_live_in_and_carried_values():
  report = plr.loop_registers(PTX)
  assert report["live_in"] == {"%rd": 1}
  assert report["live_in_registers"] == 2
  assert report["carried"] == {"%r": 1, "%f": 1}
  assert report["carried_registers"] == 2


def test_loop_instructions_by_opcode():
  assert plr.loop_opcodes(PTX) == {"add": 2, "ld": 1, "setp": 1, "bra": 1}


def test_the_ptx_is_found_in_a_log():
  log = "compiling...\n.version 9.0\n.target sm_90a\n" + PTX + "\nfinite: True\n"
  text = plr.ptx_of(log)
  assert text.startswith(".version") and text.rstrip().endswith("}")
  assert plr.loop_opcodes(text) == plr.loop_opcodes(PTX)


def test_a_kernel_without_a_loop_is_refused():
  with pytest.raises(ValueError, match="no loop"):
    plr.loop_registers(PTX.replace("@%p1 bra 	$L__BB0_1;", ""))
