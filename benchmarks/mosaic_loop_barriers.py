"""Offline, JAX >= 0.11: warpgroup barriers (and MLIR operations) a step in the Mosaic INT2 kernel's main
loop, per variant (`mosaic_int2.VARIANTS`), from the kernel's MLIR (lowered for CUDA on any machine,
captured before Mosaic serializes it). Barriers inside a conditional region (`lagged_max`'s
recomputation) are counted apart: the step's usual path runs only the others.

    PYTHONPATH=. python benchmarks/mosaic_loop_barriers.py deferred_values_first deferred_dequantized_keys_lagged
"""
from __future__ import annotations

import argparse
import re

from benchmarks import mosaic_sass
from pallas_kernels import mosaic_int2 as mi

BARRIER = re.compile(r'"bar\.sync [^"]*"')


def kernel_mlir(variant: str) -> str:
  """The kernel's module as text (before Mosaic serializes it), for 4 pairs x 512 tokens and 2 splits (one a
  warpgroup where a CTA has more)."""
  options = dict(mi.VARIANTS[variant])
  splits = max(2, options.get("warpgroups", 1))  # a split a warpgroup of a CTA; 8 steps keep >= 2 a split
  shapes = mosaic_sass.pool_shapes(4, 512, per_token=bool(options.get("values_per_token")))
  return mosaic_sass.lowered_modules(options, shapes, splits, lambda module, serialized, serialize: str(module))[-1]


def _region_end(lines: list[str], first: int) -> int:
  """The line closing the op at `first`: its braces balance, and no further region (`case`, `default`)
  follows."""
  depth = 0
  for j in range(first, len(lines)):
    depth += lines[j].count("{") - lines[j].count("}")
    following = lines[j + 1].strip() if j + 1 < len(lines) else ""
    if depth == 0 and j > first and not following.startswith(("case", "default")):
      return j
  return len(lines) - 1


def loop_barriers(text: str, operations: bool = False) -> tuple[int, ...]:
  """(barriers on the step's usual path, barriers in conditional regions) in the longest scf.for; with
  `operations`, also the usual path's MLIR operations (a rough measure of its instructions)."""
  lines = text.splitlines()
  loops = [i for i, line in enumerate(lines) if "scf.for" in line]
  first = max(loops, key=lambda i: _region_end(lines, i) - i)
  last = _region_end(lines, first)
  conditional = set()
  for i in range(first, last):
    if "scf.index_switch" in lines[i] or "scf.if" in lines[i]:
      conditional.update(range(i, _region_end(lines, i) + 1))
  barriers = [i for i in range(first, last) if BARRIER.search(lines[i])]
  inside = sum(i in conditional for i in barriers)
  if operations:
    usual = sum(" = " in lines[i] or "inline_asm" in lines[i] for i in range(first, last) if i not in conditional)
    return len(barriers) - inside, inside, usual
  return len(barriers) - inside, inside


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("variants", nargs="+", choices=list(mi.VARIANTS))
  args = ap.parse_args(argv)
  for variant in args.variants:
    usual, conditional, operations = loop_barriers(kernel_mlir(variant), operations=True)
    print(f"{variant}: {usual} barriers a step, {conditional} more in conditional regions; "
          f"{operations} MLIR operations on the usual path")


if __name__ == "__main__":
  main()
