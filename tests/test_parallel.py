"""Data and tensor parallelism: generate on a 4-device mesh equals generate on one device, for every
method (CPU, fake devices, in a subprocess since the device count is fixed when JAX starts)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "sharded_generate.py"


# Every cache layout: rtn4's and kivi4's are rtn2's and kivi2's with other widths (one sharding rule each, so
# they are left to the single-device tests: CI's time); +pallas: the kernel per shard under shard_map.
ALL_METHODS = ["fp16", "rtn2", "kivi2", "windowquant", "windowquant-C", "windowquant+pallas", "kivi2+pallas"]


# A mesh of data alone: windowquant (fp16's is `eval`'s 4-device run, tests/test_eval.py, against 1-device rows)
@pytest.mark.parametrize("axes,methods", [("data", ["windowquant"]), ("data,model", ALL_METHODS)])
def test_sharded_generate_equals_unsharded(llava_converted, axes, methods):
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, str(SCRIPT), str(llava_converted.folder), axes, *methods], env=env,
                          capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[1])
  assert result.returncode == 0, result.stderr[-3000:]
  for name in methods:
    assert f"{name}: sharded == plain" in result.stdout
