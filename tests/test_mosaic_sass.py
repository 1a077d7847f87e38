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
