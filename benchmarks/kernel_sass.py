"""Offline instruction and register counts of the decode kernel, without a GPU.

Two steps, because the second needs a `triton` wheel that need not share the JAX environment:

    # 1. Lower quantized_decode for CUDA on a CPU and write each pallas_call's Triton IR
    PYTHONPATH=. python benchmarks/kernel_sass.py capture --plan int2 --out /tmp/sass/int2
    # 2. Compile it for sm_90 with pip's triton (e.g. in a venv with `pip install triton`)
    python benchmarks/kernel_sass.py compile /tmp/sass/int2.0.ttir

Step 2 prints the registers a thread and, for every loop of the SASS (a backward branch), its
instruction count and the most frequent opcodes. XLA bundles its own Triton, so the counts are close
to what runs on the GPU, not exact; they compare variants, they do not time them
(`results/decode_attention_notes.md` quotes them next to the H200's timings).

The Mosaic GPU kernel's PTX, dumped on the GPU (`MOSAIC_GPU_DUMP_PTX=1 ... > V.log`), the same way:

    python benchmarks/kernel_sass.py ptx benchmarks/results/mosaic_int2_s25_ptx/wg4_large_batch_ftz.log.gz
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys

PLANS = {"mix": (0.15, 0.35, 0.5), "int2": (0.0, 0.0, 1.0), "int4": (0.0, 1.0, 0.0), "fp16": (1.0, 0.0, 0.0)}


def triton_modules(fn, *args) -> tuple[list[str], str]:
  """(the Triton IR of each pallas_call in jit(fn)(*args), the lowered module's text), lowered for CUDA on
  any machine by catching what Pallas hands to Triton."""
  import jax
  import jax._src.pallas.triton.lowering as lowering

  modules = []
  original = lowering.lower_jaxpr_to_triton_module

  def spy(*a, **k):
    result = original(*a, **k)
    modules.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  lowering.lower_jaxpr_to_triton_module = spy
  try:
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  return modules, text


def capture(plan: str, out: str, *, batch=8, tokens=32768, kv_heads=4, group=7, head_dim=128, window=32,
            kivi=False, config: dict | None = None) -> list[str]:
  """Writes OUT.<i>.ttir for each pallas_call of one decode-attention call, with a JSON of its launch."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import quantized_decode as qd

  sds = jax.ShapeDtypeStruct
  windows = tokens // window
  k_pools, v_pools = [], []
  for bits, share in zip((16, 4, 2), PLANS[plan]):
    n = int(windows * share)
    if n == 0:
      k_pools.append(None)
      v_pools.append(None)
    elif bits == 16:
      dense = qd.PoolArrays(sds((batch, kv_heads, n * window, head_dim), jnp.bfloat16), None, None, 16)
      k_pools.append(dense)
      v_pools.append(dense)
    else:
      codes = sds((batch, kv_heads, n * window, head_dim * bits // 8), jnp.uint8)
      meta = sds((batch, kv_heads, n, head_dim), jnp.float16)
      k_pools.append(qd.PoolArrays(codes, meta, meta, bits))
      token_meta = sds((batch, kv_heads, n * window, head_dim // 32), jnp.float16)
      v_pools.append(qd.PoolArrays(codes, token_meta, token_meta, bits, 32) if kivi
                     else qd.PoolArrays(codes, meta, meta, bits))
  rest = sds((batch, kv_heads, 256, head_dim), jnp.bfloat16)
  args = (sds((batch, kv_heads, group, head_dim), jnp.bfloat16), tuple(k_pools), tuple(v_pools),
          sds((3,), jnp.int32), sds((3,), jnp.int32), rest, rest, sds((batch,), jnp.int32))
  cfg = qd.DecodeConfig(**(config or {}))
  fn = lambda *a: qd.quantized_decode(*a, window_size=window, config=cfg, q_scale=head_dim ** -0.5)
  modules, text = triton_modules(fn, *args)
  launches = zip(re.findall(r"num_warps = (\d+)", text), re.findall(r"num_stages = (\d+)", text))
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  paths = []
  for i, (module, (warps, stages)) in enumerate(zip(modules, launches)):
    path = f"{out}.{i}.ttir"
    with open(path, "w") as f:
      f.write(module)
    with open(path + ".json", "w") as f:
      json.dump(dict(num_warps=int(warps), num_stages=int(stages), plan=plan, config=config or {}), f)
    paths.append(path)
    print(f"wrote {path} (num_warps {warps}, num_stages {stages})")
  return paths


def loops(sass: str):
  """(first, last address, opcode counter) of each loop body: a backward branch and what it spans."""
  lines = []
  for line in sass.splitlines():
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
      lines.append((int(m.group(1), 16), m.group(2)))
  for address, ins in lines:
    target = re.search(r"BRA.*?0x([0-9a-f]+)", ins)
    if target and int(target.group(1), 16) < address:
      start = int(target.group(1), 16)
      body = [x for a, x in lines if start <= a <= address]
      yield start, address, collections.Counter(
          re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)


def compile_ttir(path: str, num_warps: int | None = None, num_stages: int | None = None) -> None:
  os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning
  import triton
  from triton.backends.compiler import GPUTarget

  launch = {}
  if os.path.exists(path + ".json"):
    with open(path + ".json") as f:
      launch = json.load(f)
  warps = num_warps or launch.get("num_warps", 4)
  stages = num_stages or launch.get("num_stages", 3)
  kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
  cubin = path + ".cubin"
  with open(cubin, "wb") as f:
    f.write(kernel.asm["cubin"])
  sass = _sass_of(cubin, path + ".sass")
  usage = subprocess.run([_triton_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                         check=True).stdout
  registers = re.search(r"REG:(\d+)", usage)
  # Shared memory a program (pipeline buffers and layout-conversion scratch) is what caps programs an SM
  # once registers allow more (ncu, H200: 71.7 KB a program, 3 an SM, at 128 registers).
  shared = kernel.metadata.shared if hasattr(kernel.metadata, "shared") else "?"
  print(f"{path}: {warps} warps, {stages} stages, {registers.group(1) if registers else '?'} registers a thread, "
        f"{shared} bytes of shared memory")
  _print_loops(sass)


def _triton_tool(name: str) -> str:
  """A CUDA tool pip's triton ships (ptxas, cuobjdump)."""
  import triton
  return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _sass_of(cubin: str, out: str) -> str:
  """The cubin's SASS, also written to `out`."""
  sass = subprocess.run([_triton_tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                        check=True).stdout
  with open(out, "w") as f:
    f.write(sass)
  return sass


def _print_loops(sass: str) -> None:
  for start, end, ops in loops(sass):
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(14))
    print(f"  loop {start:#x}-{end:#x}: {sum(ops.values())} instructions ({top})")


def ptx_for(ptx: str, ptxas_version: str) -> str:
  """The PTX with its `.version` lowered to what `ptxas` reads (pip triton's ptxas 12.9 takes 8.8; the H200's
  Mosaic GPU writes 9.0): the kernels use nothing newer, so the SASS is the device's up to ptxas' own choices."""
  return re.sub(r"^\.version \S+", f".version {ptxas_version}", ptx, count=1, flags=re.M)


def compile_ptx(path: str, out: str = "/tmp/kernel_sass", ptxas_version: str = "8.8") -> None:
  """A Mosaic GPU kernel's PTX (a `.ptx` file, or a program's log under MOSAIC_GPU_DUMP_PTX=1, gzipped or not)
  compiled for sm_90a with pip triton's ptxas: registers, spills, and each loop's SASS count and opcodes."""
  import gzip

  from benchmarks.ptx_loop_registers import ptx_of
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", errors="replace") as f:
    ptx = ptx_for(ptx_of(f.read()), ptxas_version)
  stem = re.sub(r"(\.log|\.ptx)?(\.gz)?$", "", os.path.basename(path))
  report, sass = compile_ptx_text(ptx, os.path.join(out, stem))
  print(path + ":", report)
  _print_loops(sass)


def compile_ptx_text(ptx: str, stem: str) -> tuple[str, str]:
  """PTX compiled for sm_90a with pip triton's ptxas into `stem`.cubin (and .ptx, .sass beside it): ptxas'
  registers and spills, and the SASS."""
  os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
  with open(stem + ".ptx", "w") as f:
    f.write(ptx)
  report = subprocess.run([_triton_tool("ptxas"), "-arch=sm_90a", "-O3", "-v", stem + ".ptx", "-o", stem + ".cubin"],
                          capture_output=True, text=True, check=True).stderr
  sass = _sass_of(stem + ".cubin", stem + ".sass")
  return "; ".join(line.split(":", 1)[-1].strip() for line in report.splitlines()
                   if "Used" in line or "spill" in line), sass


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="command", required=True)
  cap = sub.add_parser("capture", help="lower for CUDA on any machine; write the Triton IR of each launch")
  cap.add_argument("--plan", choices=list(PLANS), default="mix")
  cap.add_argument("--kivi", action="store_true", help="KIVI values: per-token scales over 32 channels")
  cap.add_argument("--config", default="{}", help="DecodeConfig fields as JSON, e.g. '{\"tile_windows\": 1}'")
  cap.add_argument("--out", default="/tmp/kernel_sass/kernel")
  comp = sub.add_parser("compile", help="compile captured IR with pip's triton; count SASS per loop")
  comp.add_argument("paths", nargs="+")
  comp.add_argument("--num-warps", type=int)
  comp.add_argument("--num-stages", type=int)
  ptx = sub.add_parser("ptx", help="compile a Mosaic GPU kernel's dumped PTX with pip's triton ptxas; count SASS")
  ptx.add_argument("paths", nargs="+", help=".ptx files, or logs of MOSAIC_GPU_DUMP_PTX=1 runs (.log[.gz])")
  ptx.add_argument("--ptxas-version", default="8.8", help="the PTX ISA version this ptxas reads")
  ptx.add_argument("--out", default="/tmp/kernel_sass", help="where the .ptx, .cubin and .sass go")
  args = ap.parse_args(argv)
  if args.command == "ptx":
    for path in args.paths:
      compile_ptx(path, args.out, args.ptxas_version)
  elif args.command == "capture":
    capture(args.plan, args.out, kivi=args.kivi, config=json.loads(args.config))
  else:
    for path in args.paths:
      compile_ttir(path, args.num_warps, args.num_stages)


if __name__ == "__main__":
  sys.exit(main())
