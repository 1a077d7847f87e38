"""The offline Mosaic SASS tool's pieces that need no plugin: the stand-in driver and the report."""
import ctypes

from benchmarks import mosaic_sass


def test_stand_in_driver_reports_an_sm90_device(tmp_path):
  """What Mosaic GPU's compiler asks the driver (the compute capability of the current context's device)
  comes back as 9.0, every call succeeding."""
  driver = ctypes.CDLL(str(mosaic_sass.stand_in_driver(tmp_path) / "libcuda.so.1"))
  device, value = ctypes.c_int(-1), ctypes.c_int(-1)
  assert driver.cuCtxGetDevice(ctypes.byref(device)) == 0 and device.value == 0
  for attribute, expected in [(75, 9), (76, 0)]:  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR
    assert driver.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) == 0
    assert value.value == expected
  text = ctypes.c_char_p()
  assert driver.cuGetErrorString(1, ctypes.byref(text)) == 0 and b"no GPU" in text.value


def test_report_lists_each_variants_loops():
  rows = [dict(variant="a", report="Used 128 registers", loops=[
      dict(start="0x10", end="0x90", instructions=622, top={"LDS": 77, "HGMMA": 16}),
      dict(start="0x20", end="0x40", instructions=5, top={"BRA": 1})])]
  text = mosaic_sass.markdown(rows, "python benchmarks/mosaic_sass.py --variants a", "2026-12-04")
  assert "| a | Used 128 registers | 622, 5 |" in text
  assert "- a 0x10-0x90 (622): LDS 77, HGMMA 16" in text
  assert "command: `python benchmarks/mosaic_sass.py --variants a`" in text
  rows[0]["loops"][0]["shared"] = 21  # (s48) a loop's shared-memory loads and stores, where counted
  assert "- a 0x10-0x90 (622): LDS 77, HGMMA 16; shared-memory loads and stores 21" in mosaic_sass.markdown(
      rows, "python benchmarks/mosaic_sass.py --variants a", "2026-12-04")


def test_shared_memory_opcodes_are_counted_by_base_name():
  """`summarize` sums SHARED_MEMORY_OPCODES over a loop's opcode counter, whose keys are base names
  (`kernel_sass.loops`: LDS.128 and LDS.U8 are both LDS)."""
  import collections
  from benchmarks import kernel_sass
  sass = "\n".join([
      "        /*0000*/                   LDS.128 R4, [R2] ;",
      "        /*0010*/                   LDSM.16.MT88.4 R8, [R3] ;",
      "        /*0020*/                   HFMA2 R1, R2, R3, R4 ;",
      "        /*0030*/              @!P0 STS.64 [R5], R6 ;",
      "        /*0040*/                   BRA 0x0 ;"])
  (_, _, ops), = kernel_sass.loops(sass)
  assert isinstance(ops, collections.Counter)
  assert sum(ops[op] for op in mosaic_sass.SHARED_MEMORY_OPCODES) == 3
