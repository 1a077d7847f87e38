"""benchmarks/kernel_ncu.py: the report it writes from Nsight Compute's CSV pages, and the call it profiles."""
import csv

from benchmarks import kernel_ncu


def _write(path, rows):
  with open(path, "w", newline="") as f:
    csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)


def test_summarize_reads_the_pages(tmp_path):
  prefix = tmp_path / "int2"
  head = ["ID", "Kernel Name", "Block Size", "Grid Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
  _write(f"{prefix}_details.csv", [head,
                                   ["0", "wq_quantized_decode", "(128, 1, 1)", "(768, 1, 1)", "SOL", "Duration", "us",
                                    "97.63"],
                                   ["0", "wq_quantized_decode", "(128, 1, 1)", "(768, 1, 1)", "Launch",
                                    "Registers Per Thread", "register/thread", "128"]])
  stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
  _write(f"{prefix}_raw.csv", [[stall.format("wait"), stall.format("barrier"), "other"], ["inst", "inst", ""],
                               ["0.85", "0.28", "1"]])
  # A prologue of 3 instructions run 100 times each, a loop of 2 run 1,000 times each
  source = [["Kernel Name", "wq_quantized_decode"],
            ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]]
  source += [["0x0", "LDC R1, c[0x0][0x28]", "1", "100"], ["0x10", "IMAD R2, R1, R1, RZ", "1", "100"],
             ["0x20", "MOV R3, R2", "0", "100"], ["0x30", "@!P0 HFMA2 R4, R4, R5, R6", "7", "1,000"],
             ["0x40", "HMMA.16816.F32 R8, R4, R6, R8", "3", "1000"]]
  _write(f"{prefix}_source.csv", source)

  text = kernel_ncu.summarize(str(prefix))
  assert "| Duration | 97.63 us |" in text and "| Registers Per Thread | 128 register/thread |" in text
  assert text.index("| wait | 0.85 |") < text.index("| barrier | 0.28 |")
  assert "other" not in text
  loop = text.split("The hottest loop:")[1]
  assert loop.startswith(" 2 SASS instructions, each executed 1,000 times (87 % of all)")
  assert "| HFMA2 | 50.0 | 70.0 |" in loop and "IMAD" not in loop  # the predicate is not the opcode


def test_call_runs_the_kernel_once(capsys):
  kernel_ncu.main(["call", "--plan", "mix", "--batch", "1", "--tokens", "1024"])
  assert "finite: True" in capsys.readouterr().out


def test_summarize_counts_shared_memory_wavefronts(tmp_path):
  """Where the source page has them: shared-memory wavefronts by instruction (with its suffixes), per loop
  iteration and per executed instruction, the data pipe's share of the raw page's L1/TEX metrics, and the spread
  of instructions over the schedulers."""
  prefix = tmp_path / "mosaic"
  head = ["ID", "Kernel Name", "Block Size", "Grid Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
  _write(f"{prefix}_details.csv", [head, ["0", "kernel_mosaic", "(512, 1, 1)", "(128, 1, 1)", "SOL", "Duration", "us",
                                          "153.3"]])
  _write(f"{prefix}_raw.csv", [["l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
                                *kernel_ncu.SCHEDULER_SPREAD], ["%", "inst", "inst", "inst"],
                               ["80.03", "1,160", "1,000", "960"]])
  source = [["Kernel Name", "kernel_mosaic"],
            ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "L1 Wavefronts Shared"]]
  source += [["0x0", "LDS.128 R4, [R2]", "5", "1000", "4000"], ["0x10", "LDS R6, [R2+0x10]", "1", "1000", "1000"],
             ["0x20", "HFMA2 R4, R4, R5, R6", "2", "1000", "0"], ["0x30", "STS [R3], R4", "0", "10", "30"]]
  _write(f"{prefix}_source.csv", source)

  text = kernel_ncu.summarize(str(prefix))
  assert "| l1tex__data_pipe_lsu_wavefronts (% of peak) | 80.0 |" in text
  assert "| instructions a scheduler: max / avg / min (max / avg) | 1,160 / 1,000 / 960 (1.160) |" in text
  wavefronts = text.split("Shared-memory wavefronts (5,030)")[1].split("The hottest loop")[0]
  assert "| LDS.128 | 79.5 | 4.0 | 4.00 |" in wavefronts and "| LDS | 19.9 | 1.0 | 1.00 |" in wavefronts
  assert "| STS | 0.6 | 0.0 | 3.00 |" in wavefronts and "HFMA2" not in wavefronts


FAKE_NCU = '''#!{python}
import sys
args = sys.argv[1:]
if "--import" in args:
  page = args[args.index("--page") + 1]
  print(open("{pages}/" + page + ".csv").read(), end="")
else:
  open(args[args.index("-o") + 1] + ".ncu-rep", "w").write("report")
'''


def test_profile_writes_summaries_and_one_archive(tmp_path, monkeypatch):
  """`profile --summary --archive`: each plan's pages and markdown beside them, then the folder in one .tgz
  without the (large) .ncu-rep reports. A stand-in `ncu` on PATH writes a report and serves the pages."""
  import sys
  import tarfile
  pages = tmp_path / "pages"
  pages.mkdir()
  head = ["ID", "Kernel Name", "Block Size", "Grid Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
  _write(pages / "details.csv", [head, ["0", "k", "(128, 1, 1)", "(8, 1, 1)", "SOL", "Duration", "us", "9.5"]])
  _write(pages / "raw.csv", [["other"], [""], ["1"]])
  _write(pages / "source.csv", [["Kernel Name", "k"], ["Address", "Source", "Warp Stall Sampling (All Samples)",
                                                       "Instructions Executed"], ["0x0", "LDS R1, [R2]", "1", "10"]])
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "ncu").write_text(FAKE_NCU.format(python=sys.executable, pages=pages))
  (bin_dir / "ncu").chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
  out, archive = tmp_path / "ncu", tmp_path / "ncu.tgz"
  kernel_ncu.main(["profile", "--plans", "int2", "--out", str(out), "--summary", "--archive", str(archive)])
  names = set(tarfile.open(archive).getnames())
  assert {"ncu/int2_b8_t32768_default_details.csv", "ncu/int2_b8_t32768_default.md", "ncu/ncu_log.txt"} <= names
  assert not any(n.endswith(".ncu-rep") for n in names)
  summary = (out / "int2_b8_t32768_default.md").read_text()
  assert "| Duration | 9.5 us |" in summary
  assert "\n- date: " in summary and "\n- device: " in summary and "--plans int2" in summary  # its provenance
  assert "\n- device: H200 (this run)" in kernel_ncu.summarize(str(out / "int2_b8_t32768_default"),
                                                              ("device: H200 (this run)",))
