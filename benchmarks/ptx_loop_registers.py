"""Which PTX values a kernel's main loop keeps live: those it uses but defines only before the loop
(loop-invariant values LLVM hoisted: addresses, wgmma descriptors), and those it carries (defined before
and inside it). Offline, on a PTX file dumped from the device (`MOSAIC_GPU_DUMP_PTX=1`); each 64-bit value
(`%rd`) costs two 32-bit registers for as long as it is live.

    python -m benchmarks.ptx_loop_registers benchmarks/results/mosaic_int2_s20_ptx/kernel_0.ptx

It also counts the loop's instructions by opcode (`ld`, `fma`, `wgmma`...: what a variant adds or removes a
step). A program's output with the PTX in it (`MOSAIC_GPU_DUMP_PTX=1` prints it) is read from its `.version`
line to the end of the kernel.

The loop is the longest span between a label and a branch back to it.
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

REGISTER = re.compile(r"%(?:rd|rs|r|f|fd|h|hh|p)\d+")
LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)")
# Instructions whose first register operand is read, not written.
NO_DEFINITION = ("st.", "st ", "bar", "barrier", "wgmma", "fence", "bra", "mbarrier", "cp.", "red.", "ret",
                 "prefetch", "setmaxnreg", "stmatrix", "tcgen05")


def _statements(text: str) -> list[str]:
  return [line.split("//")[0].strip() for line in text.splitlines()]


def main_loop(lines: list[str]) -> tuple[int, int]:
  """(first, last) line indices of the longest backward branch's span."""
  labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
  spans = [(labels[m.group(1)], i) for i, line in enumerate(lines)
           if (m := BRANCH.search(line)) and labels.get(m.group(1), i + 1) < i]
  if not spans:
    raise ValueError("no backward branch: the PTX has no loop")
  return max(spans, key=lambda s: s[1] - s[0])


def _definitions_and_uses(lines: list[str]) -> tuple[set[str], set[str]]:
  defined, used = set(), set()
  for line in lines:
    names = REGISTER.findall(line)
    if not names or LABEL.match(line) or line.startswith("."):
      continue
    opcode = line.split()[1] if line.startswith("@") else line.split()[0]
    if opcode.startswith(NO_DEFINITION) or line.startswith("{"):
      used.update(names)
    else:
      defined.add(names[0])
      used.update(names[1:])
  return defined, used


def _kind(name: str) -> str:
  return name.rstrip("0123456789")


def loop_registers(text: str) -> dict:
  """Live-in (hoisted) and carried values of the main loop, counted by register kind, and the 32-bit
  registers they need."""
  lines = _statements(text)
  first, last = main_loop(lines)
  before_defined, _ = _definitions_and_uses(lines[:first])
  loop_defined, loop_used = _definitions_and_uses(lines[first:last + 1])
  live_in = (loop_used - loop_defined) & before_defined
  carried = loop_used & loop_defined & before_defined
  sizes = {"%rd": 2, "%fd": 2, "%p": 0}  # in 32-bit registers; predicates have their own file
  width = lambda names: sum(sizes.get(_kind(n), 1) for n in names)
  return dict(loop_lines=(first + 1, last + 1),
              live_in=dict(collections.Counter(map(_kind, live_in))), live_in_registers=width(live_in),
              carried=dict(collections.Counter(map(_kind, carried))), carried_registers=width(carried))


def loop_opcodes(text: str) -> dict[str, int]:
  """The main loop's instructions by opcode (the name before its first dot; a predicate is skipped), most
  frequent first."""
  lines = _statements(text)
  first, last = main_loop(lines)
  opcodes = collections.Counter()
  for line in lines[first:last + 1]:
    if not line or LABEL.match(line) or line.startswith((".", "{", "}", "$")) or line.endswith(":"):
      continue
    words = line.split()
    opcode = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    opcodes[opcode.split(".")[0].rstrip(";")] += 1
  return dict(opcodes.most_common())


def ptx_of(text: str) -> str:
  """The PTX in `text`: from its `.version` line to the closing brace of its first kernel (a program's log
  may hold the PTX among other output), or the text itself where it has no `.version`."""
  start = text.find(".version")
  if start < 0:
    return text
  end = text.find("\n}\n", start)
  return text[start:] if end < 0 else text[start:end + 3]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("ptx", type=Path)
  args = ap.parse_args(argv)
  text = ptx_of(args.ptx.read_text(errors="replace"))
  report = loop_registers(text)
  for key, value in report.items():
    print(f"{key}: {value}")
  opcodes = loop_opcodes(text)
  print(f"loop instructions: {sum(opcodes.values())}: {opcodes}")


if __name__ == "__main__":
  main()
