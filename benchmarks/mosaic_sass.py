"""Offline SASS of the Mosaic GPU INT2 kernel's variants, on a machine without a GPU (JAX >= 0.11).

Mosaic GPU compiles a kernel (MLIR -> LLVM -> PTX -> ptxas) inside the CUDA PJRT plugin, the first time XLA runs
it. That compiler can run without a GPU: the plugin exports `MosaicGpuCompile`, which asks the driver only for
the device's compute capability. For each variant this script
  1. lowers the kernel for CUDA (`--batch` x `--tokens` INT2 pool, `--splits`) and keeps the module that Mosaic
     serializes into the custom call;
  2. hands it to `MosaicGpuCompile` in a child process whose `libcuda.so.1` is a stand-in built here with gcc
     (`STAND_IN_DRIVER`: an sm_90 device, nothing else), with pip triton's ptxas and libdevice as the toolkit;
     Mosaic dumps the PTX and ptxas' report (`MOSAIC_GPU_DUMP_PTX`, `_PTXAS`); its host-side JIT then fails
     for want of the runtime library, after the dumps: nothing runs;
  3. compiles the PTX with the same ptxas (`kernel_sass.compile_ptx_text`) and counts each loop's SASS.

Needs Python >= 3.12, `jax==0.11.2 jaxlib`, `triton` (ptxas 12.9, libdevice) and the plugin's shared library
(`--plugin`, default: fetched once by `pip download --no-deps jax-cuda12-pjrt==<jax version>` into `--cache`,
188 MB). Counts are ptxas 12.9's, for PTX ISA 8.8; the H200's ptxas (ISA 9.0) gave the same 622 SASS in the
session-26 default's main loop. They compare variants' instructions; only the device times them. A loop's count
is every instruction it spans, branches rarely taken included (the lagged maximum's recompute): an upper bound of
what a step executes. ncu's source page counts executions (s39: the default's 459 spans 333 executed a step, and
s38's paired steps, 793 against 2 x 459 here, executed 691 against 2 x 333: their cut was the rare branch).

    PYTHONPATH=. python benchmarks/mosaic_sass.py --variants wg4_large_batch_ftz_vregs \
        wg4_large_batch_ftz_vregs_one_warp_fetch --tag mosaic_sass_s27
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

STAND_IN_DRIVER = r"""
/* A stand-in libcuda.so.1: what Mosaic GPU's compiler asks of the driver (an sm_90 device), nothing more. */
typedef int CUresult;
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int* version) { *version = 12080; return 0; }
CUresult cuCtxGetDevice(int* device) { *device = 0; return 0; }
CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
  *value = attribute == 75 ? 9 : 0;  /* COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76 */
  return 0;
}
CUresult cuGetErrorString(CUresult result, const char** text) { *text = "stand-in driver: no GPU"; return 0; }
"""


def stand_in_driver(cache: Path) -> Path:
  """A directory holding the stand-in `libcuda.so.1`, built with gcc if it is not there yet."""
  directory = cache / "driver"
  library = directory / "libcuda.so.1"
  if not library.exists():
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "stand_in_driver.c"
    source.write_text(STAND_IN_DRIVER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
  return directory


def toolkit(cache: Path) -> Path:
  """A CUDA root made of pip triton's ptxas and libdevice (the layout Mosaic GPU's compiler looks for)."""
  try:
    import triton
  except ImportError:
    sys.exit("mosaic_sass needs pip's triton for ptxas and libdevice: pip install triton")
  nvidia = Path(triton.__file__).parent / "backends" / "nvidia"
  root = cache / "cuda"
  for source, target in [(nvidia / "bin" / "ptxas", root / "bin" / "ptxas"),
                         (nvidia / "lib" / "libdevice.10.bc", root / "nvvm" / "libdevice" / "libdevice.10.bc")]:
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
      target.symlink_to(source)
  return root


def plugin_library(cache: Path, given: str | None) -> Path:
  """The CUDA PJRT plugin's shared library (which holds `MosaicGpuCompile`), fetched if not given."""
  if given:
    return Path(given)
  import jax
  member = "jax_plugins/xla_cuda12/xla_cuda_plugin.so"
  library = cache / "plugin" / member
  if not library.exists():
    wheels = cache / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                    f"jax-cuda12-pjrt=={jax.__version__}"], check=True)
    [wheel] = glob.glob(str(wheels / f"jax_cuda12_pjrt-{jax.__version__}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
      archive.extract(member, cache / "plugin")
  return library


def pool_shapes(batch: int, tokens: int, bits: int = 2, per_token: bool = False) -> list:
  """The kernel's inputs (q and a pool) as shapes: `batch` (request, KV head) pairs x `tokens` tokens of INT2
  (or `bits`) codes, Qwen2-7B's 7 query heads a KV head; `per_token`: KIVI's value metadata."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import mosaic_int2 as mi
  codes = jax.ShapeDtypeStruct((batch, tokens, mi.HEAD_DIM * bits // 8), jnp.uint8)
  metadata = jax.ShapeDtypeStruct((batch, tokens // mi.WINDOW, mi.HEAD_DIM), jnp.float16)
  values = jax.ShapeDtypeStruct((batch, tokens, mi.HEAD_DIM // 32), jnp.float16) if per_token else metadata
  return [jax.ShapeDtypeStruct((batch, 7, mi.HEAD_DIM), jnp.float32), codes, metadata, metadata, codes, values,
          values]


def paged_shapes(batch: int, tokens: int, bits: int = 2) -> list:
  """`paged`'s inputs as shapes: q, heaps of `tokens` / 32 records of `bits` bits a pair and room for a 16-bit
  one past them (as `wq_jax.interleaved` keeps), the page table."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import mosaic_int2 as mi
  windows = tokens // mi.WINDOW
  units = (mi.WINDOW * mi.HEAD_DIM * bits // 8 + 4 * mi.HEAD_DIM) // 2  # a record's 16-bit units
  heap = jax.ShapeDtypeStruct((batch, 1, (windows * units + mi.WINDOW * mi.HEAD_DIM)), jnp.uint16)
  return [jax.ShapeDtypeStruct((batch, 7, mi.HEAD_DIM), jnp.float32), heap, heap,
          jax.ShapeDtypeStruct((windows,), jnp.int32)]


def lowered_modules(options: dict, shapes: list, splits: int, keep, bits: int = 2) -> list:
  """`keep(module, serialized, serialize)` of each call of Mosaic's serde pass (spied on: the module it was
  given, which it leaves as it was, and the one it returns) while `pool_partials` with `options` is lowered for
  CUDA on this machine."""
  import jax

  from pallas_kernels import mosaic_int2 as mi
  options = dict(options)
  if options.pop("paged", False):  # ablation C's heaps (`paged_shapes`): a layer's records through its page table
    windows = shapes[3].shape[0]
    fn = jax.jit(lambda q, k_heap, v_heap, table: mi.paged_partials(
        q, k_heap, v_heap, table, 0, windows, bits=bits, splits=splits, **options))
  else:
    fn = jax.jit(lambda q, *pool: mi.pool_partials(q, *pool, splits=splits, **options))
  return _spied_lowering(fn, shapes, keep)


def _spied_lowering(fn, shapes: list, keep) -> list:
  """`keep(module, serialized, serialize)` of each call of Mosaic's serde pass while jitted `fn` is lowered for
  CUDA on `shapes`."""
  from jax.experimental.mosaic.gpu import core
  kept = []
  serde = core._run_serde_pass

  def spy(module, *, serialize, ir_version=None):
    out = serde(module, serialize=serialize, ir_version=ir_version)
    kept.append(keep(module, out, serialize))
    return out
  core._run_serde_pass = spy
  try:
    fn.trace(*shapes).lower(lowering_platforms=("cuda",))
  finally:
    core._run_serde_pass = serde
  return kept


def together_modules(pools: list[tuple[int, int]], batch: int, keep, paged: bool = False, dense: int = 0,
                     dense_working: int = 2) -> list:
  """(s52) `keep(...)` as `lowered_modules` gives it, for one launch (`mosaic_int2.launch_together`) of a layer's
  pools of (bits, tokens) at `batch` pairs, each with the splits and options the default's large-batch
  configuration gives it (`quantized_decode.mosaic_plan`); `paged`: ablation C's formats through one page table
  (heaps sized for the widest format's records); `dense` (s53): `dense` FP16 tokens a pair and an 80-token rest in
  the same launch (`mosaic_dense`), the pools sharing the SMs it leaves (`quantized_decode.dense_launch_config`)."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  from pallas_kernels import mosaic_int2 as mi
  from pallas_kernels import quantized_decode as qd
  config = qd.large_batch(qd.DecodeConfig(multiprocessors=132, mosaic_dense=bool(dense),
                                          mosaic_dense_working=dense_working))
  if dense:
    config, dense_splits = qd.dense_launch_config(config, batch, len(pools))

  def launch(*arrays):
    plans = []
    if dense:
      arrays, (k16, v16, rest_k, rest_v) = arrays[:-4], arrays[-4:]
    for i, (bits, tokens) in enumerate(pools):
      windows = tokens // mi.WINDOW
      if paged:  # one heap and page table: the formats' entries one after another
        pages = arrays[3].shape[0]
        splits, options = qd.mosaic_plan(batch, pages, bits, config)
        first = sum(t // mi.WINDOW for _, t in pools[:i])
        plans.append(mi.paged_plan(*arrays, first, windows, bits=bits, splits=splits, **options))
        continue
      splits, options = qd.mosaic_plan(batch, windows, bits, config)
      q, *pool = arrays[7 * i:7 * i + 7]
      plans.append(mi.range_plan(q, *pool, 0, windows, windows=windows, splits=splits, **options))
    if dense:
      segments = [md.Segment(k16, v16, jnp.arange(batch), jnp.zeros((batch,), jnp.int32), jnp.full((batch,), dense)),
                  md.Segment(rest_k, rest_v, jnp.arange(batch), jnp.zeros((batch,), jnp.int32),
                             jnp.full((batch,), 64))]
      plans.append(qd._dense_plan(arrays[0].reshape(batch, 1, *arrays[0].shape[1:]), segments, splits=dense_splits,
                                  config=config, q_scale=1.0, interpret=False))
    return mi.launch_together(plans)
  if paged:
    shapes = paged_shapes(batch, sum(tokens for _, tokens in pools), max(bits for bits, _ in pools))
  else:
    shapes = [x for bits, tokens in pools for x in pool_shapes(batch, tokens, bits)]
  if dense:
    shapes += [jax.ShapeDtypeStruct((batch, t, mi.HEAD_DIM), jnp.bfloat16) for t in (dense, dense, 80, 80)]
  return _spied_lowering(jax.jit(launch), shapes, keep)


def _bytecode(module, serialized, serialize):  # only the serializing pass's output goes to the custom call
  if not serialize:
    return None
  buffer = io.BytesIO()
  serialized.operation.write_bytecode(buffer)
  return buffer.getvalue()


def serialized_module(variant: str, batch: int, tokens: int, splits: int, overrides: dict | None = None,
                      bits: int = 2, together: list[tuple[int, int]] | None = None, paged: bool = False,
                      dense: int = 0) -> bytes:
  """The variant's Mosaic module as the custom call carries it (bytecode after Mosaic's serialization pass),
  for `batch` (request, KV head) pairs x a pool of `tokens` INT2 (or `bits`) codes, with `overrides` of its
  options; with `together`, (bits, tokens) pools in one launch as the default configures them (`variant` a name)."""
  from pallas_kernels import mosaic_int2 as mi

  if together:
    return [m for m in together_modules(together, batch, _bytecode, paged, dense) if m is not None][-1]
  options = dict(mi.VARIANTS[variant], **(overrides or {}))
  if options.get("paged"):
    shapes = paged_shapes(batch, tokens, bits)
  else:
    shapes = pool_shapes(batch, tokens, bits, bool(options.get("values_per_token")))
  return [m for m in lowered_modules(options, shapes, splits, _bytecode, bits) if m is not None][-1]


def _compile_in_this_process(args) -> None:
  """The child's part: lower, then run the plugin's compiler, which dumps into MOSAIC_GPU_DUMP_TO."""
  module = serialized_module(args.variant, args.batch, args.tokens, args.splits, json.loads(args.overrides),
                             args.bits, _pools(args.together), args.paged, args.dense)
  compile_module = ctypes.CDLL(args.plugin).MosaicGpuCompile
  compile_module.argtypes = [ctypes.c_char_p, ctypes.c_int]
  compile_module.restype = ctypes.c_void_p
  compile_module(module, len(module))  # fails after the dumps: the host JIT lacks Mosaic's runtime library


def _pools(together: list[str] | None) -> list[tuple[int, int]] | None:
  """`--together`'s "bits:tokens" pools."""
  return [tuple(int(x) for x in pool.split(":")) for pool in together] if together else None


def compile_variant(variant: str, out: Path, *, batch: int, tokens: int, splits: int, plugin: Path,
                    cache: Path, overrides: str = "{}", bits: int = 2, together: list[str] | None = None,
                    paged: bool = False, dense: int = 0) -> Path:
  """Dumps the variant's PTX and ptxas report under `out/variant`; returns the PTX's path."""
  dump = out / variant
  dump.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu", MOSAIC_GPU_CUDA_ROOT=str(toolkit(cache)),
             LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(stand_in_driver(cache)),
                                                            os.environ.get("LD_LIBRARY_PATH")])),
             MOSAIC_GPU_DUMP_TO=str(dump), MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1")
  command = [sys.executable, __file__, "--child", "--variant", variant, "--batch", str(batch), "--tokens",
             str(tokens), "--splits", str(splits), "--plugin", str(plugin), "--overrides", overrides,
             "--bits", str(bits), *(["--together", *together] if together else []), *(["--paged"] if paged else []),
             "--dense", str(dense)]
  log = subprocess.run(command, env=env, capture_output=True, text=True)
  ptx = sorted(dump.glob("*.ptx"))
  if not ptx:
    raise RuntimeError(f"{variant}: no PTX dumped (exit {log.returncode}):\n{log.stderr[-3000:]}")
  return ptx[-1]


def summarize(variant: str, ptx: Path, out: Path) -> dict:
  """Registers, spills and each loop's SASS count (the longest first) of the variant's compiled PTX."""
  from benchmarks import kernel_sass

  ptx_88 = kernel_sass.ptx_for(ptx.read_text(), "8.8")  # the plugin's own PTX compiler writes ISA 9.0
  report, sass = kernel_sass.compile_ptx_text(ptx_88, str(out / variant / "sass"))
  loops = sorted(kernel_sass.loops(sass), key=lambda loop: -sum(loop[2].values()))
  return dict(variant=variant, report=report, loops=[
      dict(start=hex(start), end=hex(end), instructions=sum(ops.values()), top=dict(ops.most_common(12)),
           shared=sum(ops[op] for op in SHARED_MEMORY_OPCODES))
      for start, end, ops in loops])


# The shared-memory loads and stores a warp issues (s48: where the SMs bound the INT2 kernel, a step's time followed
# these, through the MIO queue, more than its arithmetic)
SHARED_MEMORY_OPCODES = ("LDS", "LDSM", "STS", "STSM")


def markdown(rows: list[dict], command: str, date: str, setting: str = "") -> str:
  lines = ["# Mosaic INT2 kernel: SASS a loop, compiled offline", "", f"- command: `{command}`", f"- date: {date}",
           *([f"- lowered for: {setting}"] if setting else []),
           "- device: none (CPU); the CUDA PJRT plugin's Mosaic compiler with a stand-in driver (sm_90a), pip "
           "triton's ptxas 12.9", "",
           "Each loop is a backward branch and the code it spans (nested loops are counted inside their parents).",
           "", "| variant | ptxas | loops (SASS each, largest first) |", "|---|---|---|"]
  for row in rows:
    counts = ", ".join(str(loop["instructions"]) for loop in row["loops"][:4])
    lines.append(f"| {row['variant']} | {row['report']} | {counts} |")
  lines += ["", "Opcodes of each variant's largest loops:", ""]
  for row in rows:
    for loop in row["loops"][:2]:
      top = ", ".join(f"{k} {v}" for k, v in loop["top"].items())
      shared = f"; shared-memory loads and stores {loop['shared']}" if "shared" in loop else ""
      lines.append(f"- {row['variant']} {loop['start']}-{loop['end']} ({loop['instructions']}): {top}{shared}")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--variants", nargs="+", default=["wg4_large_batch_ftz_vregs"])
  ap.add_argument("--batch", type=int, default=128, help="(request, KV head) pairs: 128 is batch 32 of Qwen2-7B")
  ap.add_argument("--tokens", type=int, default=19968)
  ap.add_argument("--splits", type=int, default=4)
  ap.add_argument("--bits", type=int, default=2, choices=[2, 4], help="the pool's codes: INT2 or INT4")
  ap.add_argument("--overrides", default="{}", help='options set on every variant, as JSON: \'{"stages": 3}\'')
  ap.add_argument("--together", nargs="+", help="(s52) pools as bits:tokens in one launch (`launch_together`), "
                  "each as the default's large-batch configuration takes it; --variants then names the result")
  ap.add_argument("--paged", action="store_true", help="with --together: ablation C's formats through one page table")
  ap.add_argument("--dense", type=int, default=0, help="(s53) with --together: this many FP16 tokens a pair and an "
                  "80-token rest in the same launch (`mosaic_dense`)")
  ap.add_argument("--plugin", help="xla_cuda_plugin.so of jax-cuda12-pjrt (fetched into --cache if not given)")
  ap.add_argument("--cache", default=os.path.expanduser("~/.cache/wq_mosaic_sass"))
  ap.add_argument("--out", default="/tmp/mosaic_sass")
  ap.add_argument("--results", default=None, help="write JSON and markdown here (e.g. benchmarks/results)")
  ap.add_argument("--tag", default="mosaic_sass")
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--variant", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.child:
    return _compile_in_this_process(args)
  from benchmarks.harness import provenance

  cache, out = Path(args.cache), Path(args.out)
  plugin = plugin_library(cache, args.plugin)
  rows = []
  for variant in args.variants:
    ptx = compile_variant(variant, out, batch=args.batch, tokens=args.tokens, splits=args.splits, plugin=plugin,
                          cache=cache, overrides=args.overrides, bits=args.bits, together=args.together,
                          paged=args.paged, dense=args.dense)
    rows.append(summarize(variant, ptx, out))
    loops = ", ".join(str(loop["instructions"]) for loop in rows[-1]["loops"][:4])
    print(f"{variant}: {rows[-1]['report']}; loops {loops}", flush=True)
  if args.results:
    meta = provenance()
    setting = (f"{args.batch} (request, KV head) pairs x {args.tokens} tokens of INT{args.bits} codes, {args.splits} "
               f"splits, options overridden by {args.overrides}")
    if args.together:
      setting = (f"{args.batch} (request, KV head) pairs; pools (bits:tokens) {' '.join(args.together)} in one launch, "
                 "each as the default's large-batch configuration takes it"
                 + (f"; {args.dense} FP16 tokens a pair and an 80-token rest beside them (`mosaic_dense`)"
                    if args.dense else ""))
    command = meta["command"]
    Path(args.results).mkdir(parents=True, exist_ok=True)
    with open(Path(args.results) / f"{args.tag}.json", "w") as f:
      json.dump(dict(command=command, date=meta["date"], setting=setting, rows=rows), f, indent=1)
    with open(Path(args.results) / f"{args.tag}.md", "w") as f:
      f.write(markdown(rows, command, meta["date"], setting))


if __name__ == "__main__":
  sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
  main()
