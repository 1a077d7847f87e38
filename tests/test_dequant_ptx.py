"""The kernel's PTX unpacking snippets, run by a small emulator of the instructions they use, against
the plain arithmetic of the codes (they only run on a GPU; interpret mode takes the jnp path)."""
import numpy as np
import pytest

from pallas_kernels import quantized_decode as qd


def _halves(word: int) -> np.ndarray:
  return np.array([word & 0xFFFF, word >> 16], np.uint16).view(np.float16)


def _word(halves) -> int:
  lo, hi = (int(x) for x in np.asarray(halves, np.float16).view(np.uint16))
  return lo | hi << 16


def run_ptx(text: str, operands: dict[str, int]) -> dict[str, int]:
  """Executes the snippet's mov, prmt, shl, lop3 (0xea: (a & b) | c), sub.f16x2 and fma.rn.f16x2."""
  regs = dict(operands)

  def value(x: str) -> int:
    x = x.strip()
    return int(x, 16) if x.startswith("0x") else int(x) if x.isdigit() else regs[x]

  for line in text.splitlines():
    line = line.strip().rstrip(";")
    if not line or line in "{}" or line.startswith(".reg"):
      continue
    op, args = line.split(None, 1)
    dst, *src = [a.strip() for a in args.split(",")]
    if op == "mov.b32":
      regs[dst] = value(src[0])
    elif op == "prmt.b32":  # byte i of the result is byte (selector nibble i) of {b, a}
      pool = value(src[0]) | value(src[1]) << 32
      sel = value(src[2])
      regs[dst] = sum(((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
    elif op == "shl.b32":
      regs[dst] = (value(src[0]) << value(src[1])) & 0xFFFFFFFF
    elif op == "shr.b32":
      regs[dst] = value(src[0]) >> value(src[1])
    elif op == "lop3.b32":
      assert src[3] == "0xea"
      regs[dst] = (value(src[0]) & value(src[1])) | value(src[2])
    elif op == "sub.f16x2":
      regs[dst] = _word(_halves(value(src[0])) - _halves(value(src[1])))
    elif op == "fma.rn.f16x2":  # one rounding: the f16 product is exact in float64
      a, b, c = (_halves(value(x)).astype(np.float64) for x in src)
      regs[dst] = _word((a * b + c).astype(np.float16))
    else:
      raise NotImplementedError(op)
  return regs


@pytest.mark.parametrize("bits", [2, 4])
def test_dequant_snippet_gives_scale_times_code_plus_minimum(bits):
  rng = np.random.default_rng(bits)
  for part in range(8 // bits):
    text = qd._dequant_asm(bits, part).replace("$", "r")
    for _ in range(64):
      codes = rng.integers(0, 256, 4)
      scales = rng.uniform(0.01, 2, 4).astype(np.float16)
      minimums = rng.uniform(-3, 3, 4).astype(np.float16)
      out = run_ptx(text, {"r2": int(codes[0] | codes[1] << 8 | codes[2] << 16 | codes[3] << 24),
                           "r3": _word(scales[:2]), "r4": _word(scales[2:]),
                           "r5": _word(minimums[:2]), "r6": _word(minimums[2:])})
      got = np.concatenate([_halves(out["r0"]), _halves(out["r1"])])
      c = (codes >> (part * bits)) & ((1 << bits) - 1)
      want = (scales.astype(np.float64) * c + minimums).astype(np.float16)
      np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bits", [2, 4])
def test_raw_snippet_gives_one_plus_code_over_levels(bits):
  rng = np.random.default_rng(10 + bits)
  for part in range(8 // bits):
    text = qd._raw_asm(bits, part).replace("$", "r")
    for _ in range(64):
      codes = rng.integers(0, 256, 4)
      out = run_ptx(text, {"r2": int(codes[0] | codes[1] << 8 | codes[2] << 16 | codes[3] << 24)})
      got = np.concatenate([_halves(out["r0"]), _halves(out["r1"])])
      c = (codes >> (part * bits)) & ((1 << bits) - 1)
      np.testing.assert_array_equal(got, (1 + c / (1 << bits)).astype(np.float16))


@pytest.mark.parametrize("bits", [2, 4])
def test_interleaved_code_snippet_unpacks_each_part_of_two_words(bits):
  """Ablation C's kernel (`interleaved_decode._code_asm`): two 16-bit words of codes in one register, part p
  of byte parity e -> the two codes as halves, exactly."""
  from pallas_kernels import interleaved_decode as il
  rng = np.random.default_rng(10 + bits)
  for part in range(8 // bits):
    for parity in (0, 1):
      text = il._code_asm(bits, part, parity).replace("$", "r")
      for _ in range(64):
        words = rng.integers(0, 1 << 16, 2)
        out = run_ptx(text, {"r1": int(words[0] | words[1] << 16)})
        codes = (words >> (8 * parity + bits * part)) & ((1 << bits) - 1)
        np.testing.assert_array_equal(_halves(out["r0"]), codes.astype(np.float16))
