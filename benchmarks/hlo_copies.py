"""The large copies in XLA's optimized HLO (plain copies, and slices XLA materializes), with what feeds and
uses them.

A decode step's profile shows a 25.7 MB `memcpy128` kernel each layer (decode_profile_*_gpu.md); which
tensor it moves is in the HLO XLA dumps, not in the trace. Dump the step and read it:

    XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit__step" \\
        python -m benchmarks.decode_profile --settings 1x100 --methods fp16 --steps 5 --tag dump
    python benchmarks/hlo_copies.py /tmp/hlo --min-mb 4
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1, "s64": 8, "f64": 8}
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[([\d,]*)\][^ ]*\s+([\w\-]+)\((.*)$")


def instructions(text: str):
  """name -> (bytes, opcode, line) of every array-valued instruction."""
  found = {}
  for line in text.splitlines():
    m = _INSTR.match(line)
    if m:
      _, name, dtype, dims, opcode, _ = m.groups()
      size = math.prod(int(d) for d in dims.split(",") if d) * _BYTES.get(dtype, 4)
      found[name] = (size, opcode, line.strip())
  return found


def operands(line: str) -> list[str]:
  args = line.split("(", 1)[1] if "(" in line else ""
  return re.findall(r"%([\w.\-]+)", args)


def report(text: str, min_bytes: int, limit: int = 12) -> tuple[int, list[str]]:
  """(how many large copies, lines describing the first `limit` of them)."""
  found = instructions(text)
  out, count = [], 0
  for name, (size, opcode, line) in found.items():
    # A slice in a fusion of its own is a copy too: the o weight's was `wrapped_slice` (memcpy128 in the trace).
    is_copy = opcode == "copy" or (opcode == "fusion" and "kind=kLoop" in line
                                   and re.search(r"calls=%?wrapped_(copy|slice|dynamic_slice)", line))
    if not is_copy or size < min_bytes:
      continue
    count += 1
    if count > limit:
      continue
    out.append(f"{size / 1e6:.1f} MB  {line[:400]}")
    for op in operands(line)[:3]:
      if op in found:
        out.append(f"    from: {found[op][2][:300]}")
    use = re.compile(rf"%{re.escape(name)}(?![\w.\-])")
    users = [l for n, (_, _, l) in found.items() if n != name and use.search(l.split("=", 1)[-1])][:2]
    out += [f"    used by: {u[:300]}" for u in users]
  return count, out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("dump", type=Path, help="an --xla_dump_to folder, or one HLO text file")
  ap.add_argument("--min-mb", type=float, default=4.0)
  args = ap.parse_args(argv)
  files = ([args.dump] if args.dump.is_file()
           else sorted(args.dump.glob("*after_optimizations.txt")) or sorted(args.dump.glob("*.txt")))
  for f in files:
    count, lines = report(f.read_text(), int(args.min_mb * 1e6))
    print(f"== {f.name}: {count} copies of {args.min_mb} MB or more")
    print("\n".join(lines))


if __name__ == "__main__":
  main()
