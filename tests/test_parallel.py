"""Data parallelism: generate over a 4-device mesh equals generate on one device (CPU, fake devices)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "sharded_generate.py"


@pytest.mark.parametrize("method", ["fp16", "windowquant"])
def test_sharded_generate_equals_unsharded(llava_converted, method):
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, str(SCRIPT), str(llava_converted.folder), method], env=env,
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "sharded == plain" in result.stdout
