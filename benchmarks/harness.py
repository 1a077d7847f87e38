"""Shared benchmark plumbing: timing by median of repeats, the device's copy bandwidth and memory,
and results with their provenance."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

RESULTS = Path(__file__).parent / "results"


def device_name() -> str:
  d = jax.devices()[0]
  kind = getattr(d, "device_kind", d.platform)
  if d.platform == "cpu":
    return f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
  return f"{kind} ({d.platform}, {len(jax.devices())} device(s))"


def time_fn(fn, *args, repeats: int = 10, warmup: int = 2) -> dict:
  """Median and spread of wall time in seconds; fn's output is blocked on every call."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": repeats}


def copy_bandwidth(nbytes: int = 1 << 32) -> dict:
  """Device-to-device copy bandwidth in TB/s of bytes read + written: a jnp elementwise pass (x + 1)
  always, and torch's copy where torch has CUDA (the nearer to what the device can stream)."""
  out = {}
  x = jnp.arange(nbytes // 4, dtype=jnp.uint32)  # 4 GiB by default: one pass is ~2 ms on an H200
  seconds = time_fn(jax.jit(lambda a: a + 1), x, repeats=9)["median_s"]
  out["jnp_elementwise_TBps"] = 2 * nbytes / seconds / 1e12
  del x
  try:
    import torch
    if torch.cuda.is_available():
      # A quarter of the bytes: torch allocates outside JAX's preallocated pool, where little may be left.
      out["torch_copy_TBps"] = 2 * (nbytes // 4) / _torch_copy_seconds(torch, nbytes // 4) / 1e12
  except Exception as e:  # torch is optional: report why it is missing
    out["torch_error"] = repr(e)[:200]
  return out


def _torch_copy_seconds(torch, nbytes: int) -> float:
  src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
  dst = torch.empty_like(src)
  for _ in range(3):
    dst.copy_(src)
  times = []
  for _ in range(20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    dst.copy_(src)
    b.record()
    torch.cuda.synchronize()
    times.append(a.elapsed_time(b) / 1e3)
  del src, dst
  torch.cuda.empty_cache()
  return statistics.median(times)


def best_copy_TBps(copy: dict) -> float:
  """torch's copy when it was measured, else the jnp pass."""
  return copy.get("torch_copy_TBps") or copy["jnp_elementwise_TBps"]


def memory_stats() -> dict | None:
  """The first device's allocator statistics (bytes_in_use, peak_bytes_in_use, bytes_limit); None on CPU."""
  d = jax.devices()[0]
  return d.memory_stats() if hasattr(d, "memory_stats") else None


def provenance() -> dict:
  flags = os.environ.get("XLA_FLAGS", "")  # the same command runs differently under other flags
  return {
      "command": " ".join([*([f"XLA_FLAGS='{flags}'"] if flags else []), "python", *_invocation(), *sys.argv[1:]]),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "device": device_name(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
  }


def _invocation() -> list[str]:
  """`-m benchmarks.NAME` when run as a module (sys.argv[0] is then the file's path)."""
  script = Path(sys.argv[0])
  if script.parent.name == "benchmarks" and script.suffix == ".py":
    return ["-m", f"benchmarks.{script.stem}"]
  return [sys.argv[0]]


def write_results(name: str, rows: list[dict], columns: list[str], title: str, notes: str = "",
                  out_dir: Path | None = None) -> Path:
  """Writes NAME_<backend>.json and .md (a table with the command, date and device)."""
  out_dir = out_dir or RESULTS
  out_dir.mkdir(parents=True, exist_ok=True)
  meta = provenance()
  stem = f"{name}_{meta['backend']}"  # names may hold dots (0.5b): no with_suffix
  (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
  lines = [f"# {title}", "", f"- command: `{meta['command']}`", f"- date: {meta['date']}",
           f"- device: {meta['device']}, jax {meta['jax']}", ""]
  if notes:
    lines += [notes, ""]
  lines.append("| " + " | ".join(columns) + " |")
  lines.append("|" + "---|" * len(columns))
  for row in rows:
    lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
  (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
  return out_dir / f"{stem}.md"


def _fmt(x) -> str:
  if isinstance(x, float):
    return f"{x:.4g}"
  return str(x)
