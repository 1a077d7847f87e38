"""The profile parser of benchmarks.decode_profile, on a synthetic Perfetto trace."""
from benchmarks import decode_profile


def _trace():
  meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #13(Compute)"}},
          {"ph": "M", "pid": 1, "tid": 8, "name": "thread_name", "args": {"name": "XLA Ops"}},
          {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
          {"ph": "M", "pid": 2, "tid": 9, "name": "thread_name", "args": {"name": "Stream lookalike"}}]
  kernels = [("loop_add_fusion_3", 0, 10), ("loop_add_fusion_12", 15, 5), ("wq_quantized_decode", 18, 12),
             ("gemm.1", 40, 20)]
  events = [{"ph": "X", "pid": 1, "tid": 7, "ts": ts, "dur": dur, "name": name} for name, ts, dur in kernels]
  events += [{"ph": "X", "pid": 1, "tid": 8, "ts": 0, "dur": 60, "name": "fusion"},  # a derived line: ignored
             {"ph": "X", "pid": 2, "tid": 9, "ts": 0, "dur": 99, "name": "host"}]  # not a device: ignored
  return {"traceEvents": meta + events}


def test_summary_counts_stream_kernels_by_name_and_their_union():
  events = decode_profile.kernel_events(_trace())
  assert len(events) == 4
  summary = decode_profile.summarize(events, steps=2)
  # Intervals [0,10) [15,20) [18,30) [40,60): 10 + 15 + 20 = 45 µs busy over a 60 µs span.
  assert summary["busy_us_step"] == 22.5 and summary["span_us_step"] == 30.0 and summary["kernels_step"] == 2.0
  by = {k["kernel"]: k for k in summary["by_kernel"]}
  assert set(by) == {"loop_add_fusion", "wq_quantized_decode", "gemm"}
  assert by["loop_add_fusion"]["per_step"] == 1.0 and by["loop_add_fusion"]["us_step"] == 7.5
  assert summary["by_kernel"][0]["kernel"] == "gemm"
  # Idle: 5 µs before loop_add_fusion_12 (after [0,10)), none before wq_quantized_decode (it overlaps), 10 before
  # gemm; per step, the longest first, as shares of the 15 µs idle.
  idle = {k["kernel"]: k for k in summary["idle_before"]}
  assert [k["kernel"] for k in summary["idle_before"]] == ["(idle before gemm)", "(idle before loop_add_fusion)"]
  assert idle["(idle before gemm)"]["us_step"] == 5.0 and idle["(idle before gemm)"]["per_step"] == 0.5
  assert idle["(idle before loop_add_fusion)"]["us_step"] == 2.5
  assert abs(sum(k["share"] for k in summary["idle_before"]) - 1) < 1e-9
