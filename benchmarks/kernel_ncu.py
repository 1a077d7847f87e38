"""Hardware counters of the decode kernel: run it under Nsight Compute and keep the readable pages.

A step of the kernel took ~4x the cycles its dependent chain should (decode_attention_notes.md, run 12);
what it waits on (stall reasons, occupancy limits, instruction mix) is what `ncu` reports and no timing
can. Three modes:

    # on the H200: each plan's call once, under ncu, then its report as CSV pages
    PYTHONPATH=. python benchmarks/kernel_ncu.py profile --plans mix int2 --out $OUT
    # the Mosaic GPU INT2 kernel (JAX >= 0.11): --plans mosaic_int2 --kernel mosaic
    # the program ncu runs (one jitted call a plan)
    PYTHONPATH=. python benchmarks/kernel_ncu.py call --plan int2 --batch 8 --tokens 32768

`profile` writes, a plan each, `<plan>_b<batch>_t<tokens>_<variant>.ncu-rep` and its `details`
(throughput, occupancy, warp states, instruction mix), `raw` (every metric) and `source` (SASS with
per-instruction stall samples) pages.
(`--summary` writes each one's markdown report beside it; `--archive X.tgz` then packs the pages, without the
.ncu-rep reports, into one file.) `summarize` turns those pages into one markdown report (any machine):

    python benchmarks/kernel_ncu.py summarize $OUT/int2_b8_t32768_default --out benchmarks/results/x.md
"""
from __future__ import annotations

import argparse
import collections
import csv
import datetime
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SECTIONS = ["SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats",
            "SchedulerStats", "InstructionStats", "SourceCounters", "ComputeWorkloadAnalysis"]
# Instructions issued a scheduler (SM sub-partition), spread over the device's: where warps of one scheduler carry
# work the others do not (s46: every warpgroup's warp 0 issuing its copies), max stands above avg
SCHEDULER_SPREAD = ["smsp__inst_executed.max", "smsp__inst_executed.avg", "smsp__inst_executed.min"]


def call(plan: str, batch: int, tokens: int, variant: str, splits: int = 8) -> None:
  import jax

  from benchmarks import decode_attention as da

  key = jax.random.PRNGKey(0)
  if plan == "mosaic_int2":  # the Mosaic GPU INT2 kernel (JAX >= 0.11) on one INT2 pool of `tokens`
    from benchmarks import mosaic_int2_bench as mb
    pairs = batch * da.KV_HEADS
    variant = "fast" if variant == "default" else variant
    out = mb.attend(mb.scaled_queries(jax.random.fold_in(key, 1), pairs),
                    *mb.kernel_pool(mb.int2_pool(key, pairs, tokens), variant), splits=splits, variant=variant)
    print(plan, batch, tokens, variant, "finite:", bool(jax.numpy.isfinite(out).all()))
    return
  c = da.synthetic_cache(key, batch, tokens, plan)
  q = da.queries(jax.random.fold_in(key, 1), batch, 1)[0]
  config = da.VARIANTS[variant] if variant != "default" else None
  out = jax.jit(da.pallas_fn(config))(q, c)
  print(plan, batch, tokens, variant, "finite:", bool(jax.numpy.isfinite(out).all()))


def find_ncu() -> str:
  found = shutil.which("ncu")
  if found:
    return found
  for root in (Path("/opt/nvidia"), Path("/usr/local/cuda/bin"), Path("/usr/local")):
    hits = sorted(root.glob("**/ncu")) if root.exists() else []
    if hits:
      return str(hits[-1])
  raise SystemExit("ncu (Nsight Compute) not found on this machine")


def profile(args) -> None:
  ncu = find_ncu()
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  log = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}", f"ncu: {ncu}",
         f"device: {_device_name()}", f"command: {args.command}"]
  for plan in args.plans:
    rep = out / f"{plan}_b{args.batch}_t{args.tokens}_{args.variant}"
    cmd = [ncu, "--clock-control", "none", "--kernel-name", f"regex:{args.kernel}", "--launch-count", "4",
           "-f", "-o", str(rep), *[a for s in SECTIONS for a in ("--section", s)],
           "--metrics", ",".join(SCHEDULER_SPREAD),
           "--import-source", "no", sys.executable, __file__, "call", "--plan", plan, "--batch", str(args.batch),
           "--tokens", str(args.tokens), "--variant", args.variant, "--splits", str(args.splits)]
    log.append("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    log += [r.stdout[-3000:], r.stderr[-3000:]]
    for page, extra in (("details", []), ("raw", []), ("source", ["--print-source", "sass"])):
      r = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", page, "--csv", *extra],
                         capture_output=True, text=True)
      (out / f"{rep.name}_{page}.csv").write_text(r.stdout)
      if r.returncode:
        log.append(f"{page}: {r.stderr[-1000:]}")
    (out / "ncu_log.txt").write_text("\n".join(log))  # after each plan: a later one may run out of time
    if args.summary:  # the readable report beside the pages
      try:
        (out / f"{rep.name}.md").write_text(summarize(str(rep)))
      except (OSError, KeyError, IndexError, csv.Error) as e:  # a profile that wrote no pages: say so, go on
        log.append(f"summary of {rep.name}: {e!r}")
        (out / "ncu_log.txt").write_text("\n".join(log))
  if args.archive:  # the pages in one file (the device tool returns at most 8 files a call)
    for rep_file in out.glob("*.ncu-rep"):
      rep_file.unlink()
    with tarfile.open(args.archive, "w:gz") as tar:
      tar.add(out, arcname=out.name)
  print("\n".join(log)[-4000:])


def _number(text: str) -> float:
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return 0.0


# details-page metrics worth a line each in the summary, by name
_DETAILS = ["Duration", "SM Frequency", "DRAM Throughput", "L1/TEX Cache Throughput", "Memory Throughput",
            "Issue Slots Busy", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Grid Size",
            "Block Limit Registers", "Block Limit Shared Mem", "Achieved Active Warps Per SM",
            "Eligible Warps Per Scheduler", "No Eligible", "Warp Cycles Per Issued Instruction",
            "Executed Instructions"]


# raw-page metrics that say whether shared memory's data pipe (wavefronts), its request queue or the
# register write-back is what the L1/TEX throughput counts as busy
_SHARED_PIPE = ["l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
                "l1tex__lsuin_requests.avg.pct_of_peak_sustained_elapsed",
                "l1tex__lsu_writeback_active.avg.pct_of_peak_sustained_elapsed",
                "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
                "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed"]


def _device_name() -> str:
  found = shutil.which("nvidia-smi")
  if not found:
    return "unknown"
  r = subprocess.run([found, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
  return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "unknown"


def _provenance(prefix: str) -> list[str]:
  """The date, device and command of the profile run that wrote `prefix`'s pages, from the `ncu_log.txt`
  beside them, where that run is the log's (a later `profile` into the same folder rewrites the log)."""
  log = Path(prefix).parent / "ncu_log.txt"
  text = log.read_text() if log.exists() else ""
  if f"{Path(prefix).name} " not in text:
    return []
  return [f"- {line}" for line in text.splitlines() if line.split(":")[0] in ("date", "device", "command")]


def summarize(prefix: str, notes: tuple[str, ...] = ()) -> str:
  """Markdown of one profiled launch (the first of the report): its key metrics, why warps stalled, and
  the SASS opcodes by executed instructions and stall samples, overall and in the hottest loop. Its
  provenance from the profile's log where it has it, and `notes` (lines of it the log lacks)."""
  details = list(csv.DictReader(open(f"{prefix}_details.csv")))
  first = details[0]["ID"]
  lines = [f"# ncu: {Path(prefix).name} ({details[0]['Kernel Name']}, block {details[0]['Block Size']}, "
           f"grid {details[0]['Grid Size']})", "", *_provenance(prefix), *[f"- {n}" for n in notes], "",
           "| metric | value |", "|---|---:|"]
  seen = {}
  for r in details:
    if r["ID"] == first and r["Metric Name"] in _DETAILS and r["Metric Name"] not in seen:
      seen[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
  lines += [f"| {k} | {seen[k]} |" for k in _DETAILS if k in seen]
  raw = list(csv.reader(open(f"{prefix}_raw.csv")))
  shared = {h: v for h, v in zip(raw[0], raw[2]) if h in _SHARED_PIPE}  # which part of the L1/TEX is busy
  lines += [f"| {h.split('.')[0]} (% of peak) | {_number(shared[h]):.1f} |" for h in _SHARED_PIPE if h in shared]
  spread = {h: _number(v) for h, v in zip(raw[0], raw[2]) if h in SCHEDULER_SPREAD}
  if len(spread) == len(SCHEDULER_SPREAD):  # max / avg over the device's schedulers: 1 where balanced
    high, mean, low = (spread[h] for h in SCHEDULER_SPREAD)
    lines.append(f"| instructions a scheduler: max / avg / min (max / avg) | {high:,.0f} / {mean:,.0f} / {low:,.0f} "
                 f"({high / mean:.3f}) |")
  stalls = {h.split("smsp__average_warps_issue_stalled_")[1].split("_per_issue")[0]: _number(v)
            for h, v in zip(raw[0], raw[2]) if h.startswith("smsp__average_warps_issue_stalled_")
            and h.endswith("per_issue_active.ratio")}
  lines += ["", "Warp cycles an issued instruction, by stall reason (sum = cycles between a warp's issues):", "",
            "| reason | cycles |", "|---|---:|"]
  lines += [f"| {k} | {v:.2f} |" for k, v in sorted(stalls.items(), key=lambda kv: -kv[1]) if v >= 0.01]
  rows = list(csv.reader(open(f"{prefix}_source.csv")))
  header = {h: i for i, h in enumerate(rows[1])}
  body = rows[2:]
  executed = [_number(r[header["Instructions Executed"]]) for r in body]
  samples = [_number(r[header["Warp Stall Sampling (All Samples)"]]) for r in body]
  opcode = [re.sub(r"^@!?U?P\w+\s+", "", r[header["Source"]].strip()).split(" ")[0].split(".")[0] for r in body]
  # A loop body's instructions share one execution count; the hottest loop's count carries the most work.
  hot = max(collections.Counter(executed).items(), key=lambda kv: kv[0] * kv[1])[0]
  loop = [i for i, e in enumerate(executed) if e == hot]

  def table(indices, title):
    by_op, by_samples = collections.Counter(), collections.Counter()
    for i in indices:
      by_op[opcode[i]] += executed[i]
      by_samples[opcode[i]] += samples[i]
    total, total_samples = sum(by_op.values()) or 1, sum(by_samples.values()) or 1
    out = ["", title, "", "| opcode | % instructions | % stall samples |", "|---|---:|---:|"]
    out += [f"| {op} | {100 * n / total:.1f} | {100 * by_samples[op] / total_samples:.1f} |"
            for op, n in by_op.most_common(20)]
    return out

  lines += table(range(len(body)), f"All {sum(executed):,.0f} warp-instructions by opcode:")
  if "L1 Wavefronts Shared" in header:  # what keeps the shared-memory data pipe busy, by instruction
    wavefronts, issued = collections.Counter(), collections.Counter()
    for i, r in enumerate(body):
      n = _number(r[header["L1 Wavefronts Shared"]])
      if n:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[header["Source"]].strip()).split(" ")[0]  # with its suffixes
        wavefronts[op] += n
        issued[op] += executed[i]
    total = sum(wavefronts.values()) or 1
    lines += ["", f"Shared-memory wavefronts ({total:,.0f}) by instruction, and per hottest-loop iteration:", "",
              "| instruction | % wavefronts | a loop iteration | wavefronts an instruction |", "|---|---:|---:|---:|"]
    lines += [f"| {op} | {100 * n / total:.1f} | {n / hot:.1f} | {n / issued[op]:.2f} |"
              for op, n in wavefronts.most_common(12)]
  lines += table(loop, f"The hottest loop: {len(loop)} SASS instructions, each executed {hot:,.0f} times "
                       f"({100 * hot * len(loop) / sum(executed):.0f} % of all):")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="mode", required=True)
  summary = sub.add_parser("summarize")
  summary.add_argument("prefix", help="a profile's path without _details.csv")
  summary.add_argument("--out", help="markdown file (default: print)")
  summary.add_argument("--note", action="append", default=[], help="a line of provenance the log lacks")
  for name in ("call", "profile"):
    p = sub.add_parser(name)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--variant", default="default", help="a name of decode_attention.VARIANTS")
    p.add_argument("--splits", type=int, default=8, help="the Mosaic kernel's splits a pair (mosaic_int2 plan)")
    if name == "call":
      p.add_argument("--plan", default="mix")
    else:
      p.add_argument("--plans", nargs="+", default=["mix", "int2"])
      p.add_argument("--kernel", default="wq_", help="regex of the kernels to profile")
      p.add_argument("--out", default=os.environ.get("OUT", "/tmp/ncu"))
      p.add_argument("--summary", action="store_true", help="write each profile's summary (markdown) beside it")
      p.add_argument("--archive", help="then pack the folder's pages (not the .ncu-rep reports) into this .tgz")
  args = ap.parse_args(argv)
  args.command = " ".join(["benchmarks/kernel_ncu.py", *(sys.argv[1:] if argv is None else argv)])
  if args.mode == "summarize":
    text = summarize(args.prefix, tuple(args.note))
    if args.out:
      Path(args.out).write_text(text)
    print(text)
  elif args.mode == "call":
    call(args.plan, args.batch, args.tokens, args.variant, args.splits)
  else:
    profile(args)


if __name__ == "__main__":
  main()
