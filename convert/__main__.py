"""python -m convert SRC_DIR OUT_DIR [--dtype bfloat16|float16|float32]"""
from __future__ import annotations

import argparse
import sys
import time

import absl.logging

from convert.checkpoint import DTYPES, convert_checkpoint
from convert.framework import ConversionError


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m convert", description=(
      "Convert a Hugging Face checkpoint folder (config.json, safetensors, tokenizer, processor "
      "configs) into a WindowQuant-JAX checkpoint."))
  parser.add_argument("src", help="the Hugging Face checkpoint folder")
  parser.add_argument("out", help="the folder to create")
  parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                      help="parameter dtype of the converted checkpoint (default: bfloat16)")
  parser.add_argument("--quiet", action="store_true", help="no progress bar")
  args = parser.parse_args(argv)
  absl.logging.set_verbosity(absl.logging.ERROR)  # orbax's informational warnings are noise here
  start = time.perf_counter()
  try:
    out = convert_checkpoint(args.src, args.out, dtype=args.dtype, progress=not args.quiet)
  except ConversionError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"wrote {out} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
