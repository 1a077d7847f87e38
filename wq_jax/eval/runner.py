"""Running a task: batches through `generate`, data parallel over a mesh, into a resumable JSONL file.

One row a question, appended with the rest of its batch and flushed to disk
(`os.fsync`) as the batch finishes:

    qid, task, type, method (the run's label), prediction (option index or null),
    answer, correct (null when the answer is not public or the metric is graded),
    score (1/0, or ROUGE-L F), text (the reply), bits ({"16", "4", "2"}: windows of
    the batch's plan at each width, over layers x windows), frames, scoring,
    max_new_tokens, batch_size, error (null, or what went wrong)

A rerun reads the file, skips the (task, method, qid) it holds and never writes
one twice; a torn last line (a kill mid-write) is cut off first, so an
interrupted run loses at most its batch in flight. A question whose media
cannot be read, or whose batch `generate` refuses even alone, becomes an error
row and the run goes on (`retry_errors` runs them again).

Batches: `batch_size` questions in file order, grouped by what must match
inside one `generate` batch (the frame count; for Qwen2-VL the frame size too).
`generate` pads a batch to the mesh's data axis with copies of its last request,
which take no part in the plan and whose results are dropped; the last, uneven
batch may compile once more.
Videos decode in threads one batch ahead, while the devices run the current one.
Under a quantizing method a batch shares one plan, so a question's answer
depends on its batch: keep `batch_size` fixed when comparing runs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

from wq_jax import generation
from wq_jax.eval import scoring
from wq_jax.eval.media import load_media
from wq_jax.eval.tasks import Question

BITS = (16, 4, 2)
LOADER_THREADS = 4


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One method's run over a task."""
  task: str
  method: str
  config: object | None = None  # the method's config dataclass; None: its default
  label: str = ""  # the rows' `method`; default: the method's name
  num_frames: int | None = 32
  batch_size: int = 1
  max_new_tokens: int = 16
  scoring: str = "generate"  # "generate" (parse the reply) or "loglik" (letter logits)
  attention: str = "xla"

  @property
  def name(self) -> str:
    return self.label or self.method


# ----------------------------------------------------------------------------- the results file


def read_rows(path: Path) -> list[dict]:
  """The rows of a results file; a torn last line (no newline) is cut off the file."""
  if not path.exists():
    return []
  data = path.read_bytes()
  end = data.rfind(b"\n") + 1
  if end < len(data):
    with open(path, "r+b") as f:
      f.truncate(end)
  rows = []
  for number, line in enumerate(data[:end].splitlines(), 1):
    if line.strip():
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number} is not a JSON row ({e}); fix or move the file") from e
  return rows


def append_rows(path: Path, rows: Sequence[dict]) -> None:
  """Appends rows and makes them durable before returning."""
  if not rows:
    return
  with open(path, "a") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
    f.flush()
    os.fsync(f.fileno())


def _rewrite_without(path: Path, drop) -> None:
  """Rewrites the file without the rows `drop` selects (atomically: temp file, then rename)."""
  keep = [r for r in read_rows(path) if not drop(r)]
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in keep))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


# ----------------------------------------------------------------------------- running


def _row(q: Question, cfg: RunConfig, **fields) -> dict:
  row = {"qid": q.qid, "task": cfg.task, "type": q.type, "method": cfg.name, "prediction": None,
         "answer": q.answer, "correct": None, "score": None, "text": None, "bits": None,
         **_setting(cfg), "batch_size": cfg.batch_size, "error": None}
  row.update(fields)
  return row


def _error_row(q: Question, cfg: RunConfig, error: BaseException) -> dict:
  return _row(q, cfg, error=f"{type(error).__name__}: {error}")


def _batch_key(model, frames: np.ndarray) -> tuple:
  # LLaVA-OneVision resizes every frame to one square, so only the count sets its tokens;
  # Qwen2-VL's token count follows the frame size too.
  return frames.shape[:1] if model.model_type == "llava_onevision" else frames.shape


def _generate_rows(model, group: list[tuple[Question, np.ndarray]], cfg: RunConfig, mesh) -> list[dict]:
  """Rows of one batch through `generate` (which pads it to the mesh; padding takes no part in the plan)."""
  questions = [q for q, _ in group]
  videos = [f for _, f in group]
  prompts = [q.prompt for q in questions]
  loglik = cfg.scoring == "loglik"
  g = generation.generate(
      model, videos, prompts, method=cfg.method,
      config=cfg.config, num_frames=None, max_new_tokens=1 if loglik else cfg.max_new_tokens,
      attention=cfg.attention, return_logits=loglik, mesh=mesh)
  bits = {str(b): int((g.bit_plan == b).sum()) for b in BITS}
  rows = []
  for i, q in enumerate(questions):
    if loglik:
      pred = scoring.choice_from_logits(g.logits[i, 0], scoring.letter_token_ids(model.tokenizer, len(q.options)))
      score = None if q.answer is None else float(pred == q.answer)
    else:
      pred, score = scoring.judge(q.metric, g.text[i], q.options, q.answer)
    correct = None if score is None or q.metric not in scoring.BINARY else score == 1.0
    rows.append(_row(q, cfg, prediction=pred, correct=correct, score=score, text=g.text[i], bits=bits))
  return rows


def _run_group(model, group, cfg: RunConfig, mesh) -> list[dict]:
  """One batch; if `generate` refuses it, each question alone, failures as error rows."""
  try:
    return _generate_rows(model, group, cfg, mesh)
  except Exception as e:  # one bad request must not stop the run
    if len(group) == 1:
      return [_error_row(group[0][0], cfg, e)]
  return [row for item in group for row in _run_group(model, [item], cfg, mesh)]


def _load(q: Question, num_frames: int | None):
  """The question's frames, or the exception that reading them raised."""
  try:
    return load_media(q.media, num_frames)
  except Exception as e:  # a missing or corrupt video: recorded, and the run goes on
    return e


def _run_chunk(model, chunk: list[Question], loaded: list, cfg: RunConfig, mesh) -> list[dict]:
  rows, groups = {}, defaultdict(list)
  for q, frames in zip(chunk, loaded):
    if isinstance(frames, Exception):
      rows[q.qid] = _error_row(q, cfg, frames)
    else:
      groups[_batch_key(model, frames)].append((q, frames))
  for group in groups.values():
    for row in _run_group(model, group, cfg, mesh):
      rows[row["qid"]] = row
  return [rows[q.qid] for q in chunk]


def _setting(cfg: RunConfig) -> dict:
  return {"frames": cfg.num_frames, "scoring": cfg.scoring, "max_new_tokens": cfg.max_new_tokens}


def _check_setting(done: list[dict], cfg: RunConfig, path: Path) -> None:
  want = _setting(cfg)
  for row in done:
    for key in want:
      if row.get(key) != want[key]:
        raise ValueError(f"{path} holds {cfg.name} rows with {key}={row.get(key)!r}, but this run has "
                         f"{key}={want[key]!r}: use another --output, or the same setting")


def run_task(model, questions: Sequence[Question], cfg: RunConfig, output, *, mesh=None,
             retry_errors: bool = False, progress: bool = True) -> list[dict]:
  """Answers every question not yet in `output`; returns this run's rows for `questions`, in their order."""
  output = Path(output)
  output.parent.mkdir(parents=True, exist_ok=True)
  if cfg.scoring == "loglik" and any(q.metric != "choice" for q in questions):
    raise ValueError("log-likelihood scoring needs multiple-choice questions: pick tasks with --subtasks")
  mine = lambda r: r.get("task") == cfg.task and r.get("method") == cfg.name
  if retry_errors:
    _rewrite_without(output, lambda r: mine(r) and r.get("error") is not None)
  done = [r for r in read_rows(output) if mine(r)]
  _check_setting(done, cfg, output)
  done_ids = {r["qid"] for r in done}
  pending = [q for q in questions if q.qid not in done_ids]
  chunks = [pending[i:i + cfg.batch_size] for i in range(0, len(pending), cfg.batch_size)]
  bar = tqdm(total=len(pending), desc=cfg.name, unit="q", disable=not progress, file=sys.stderr)
  # PyAV decodes without the GIL, so the next batch's videos decode while this one runs.
  with bar, ThreadPoolExecutor(LOADER_THREADS) as pool:
    submit = lambda chunk: [pool.submit(_load, q, cfg.num_frames) for q in chunk]
    ahead = submit(chunks[0]) if chunks else []
    for k, chunk in enumerate(chunks):
      loading, ahead = ahead, (submit(chunks[k + 1]) if k + 1 < len(chunks) else [])
      rows = _run_chunk(model, chunk, [f.result() for f in loading], cfg, mesh)
      append_rows(output, rows)
      bar.update(len(rows))
  by_id = {r["qid"]: r for r in read_rows(output) if mine(r)}
  return [by_id[q.qid] for q in questions]


# ----------------------------------------------------------------------------- summaries


def _stats(rows: list[dict]) -> dict:
  scores = [r["score"] for r in rows if r["error"] is None and r["score"] is not None]
  return {"questions": len(rows), "scored": len(scores), "errors": sum(r["error"] is not None for r in rows),
          "accuracy": 100.0 * float(np.mean(scores)) if scores else None}


def summarize(rows: Sequence[dict]) -> dict:
  """Per method: accuracy (in %; ROUGE-L F for graded tasks) per type and overall, over the
  scored rows (error rows and hidden answers are counted apart), the mean of the type
  accuracies, and the share of windows the plans put at each bit width."""
  by_method = defaultdict(list)
  for r in rows:
    by_method[r["method"]].append(r)
  out = {}
  for method, mine in by_method.items():
    by_type = defaultdict(list)
    for r in mine:
      by_type[r["type"]].append(r)
    types = {t: _stats(rs) for t, rs in sorted(by_type.items())}
    accs = [s["accuracy"] for s in types.values() if s["accuracy"] is not None]
    counts = {str(b): sum(r["bits"][str(b)] for r in mine if r["bits"]) for b in BITS}
    total = sum(counts.values())
    out[method] = {"overall": _stats(mine), "types": types,
                   "mean_of_types": float(np.mean(accs)) if accs else None,
                   "window_share": {b: (c / total if total else None) for b, c in counts.items()}}
  return out


def _cell(x) -> str:
  return "-" if x is None else f"{x:.1f}"


def comparison_table(summary: dict) -> str:
  """The methods side by side: accuracy per type, overall, mean of types, errors, window shares."""
  methods = list(summary)
  types = sorted({t for s in summary.values() for t in s["types"]})
  width = max([len("mean of types"), len("windows 16/4/2 %")] + [len(t) for t in types])
  cols = [max(len(m), 14) for m in methods]
  line = lambda name, cells: f"{name:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols))
  out = [line("accuracy %", methods)]
  for t in types:
    out.append(line(t, [_cell(summary[m]["types"].get(t, {}).get("accuracy")) for m in methods]))
  out.append(line("overall", [_cell(summary[m]["overall"]["accuracy"]) for m in methods]))
  out.append(line("mean of types", [_cell(summary[m]["mean_of_types"]) for m in methods]))
  out.append(line("scored / errors", [f"{summary[m]['overall']['scored']} / {summary[m]['overall']['errors']}"
                                      for m in methods]))
  shares = lambda m: "/".join("-" if v is None else f"{100 * v:.0f}" for v in summary[m]["window_share"].values())
  out.append(line("windows 16/4/2 %", [shares(m) for m in methods]))
  return "\n".join(out)


def write_submission(rows: Sequence[dict], path: Path) -> Path:
  """EgoSchema's submission file: q_uid,answer (the predicted index; -1 when none, as lmms-eval writes)."""
  lines = ["q_uid,answer"] + [f"{r['qid']},{-1 if r['prediction'] is None else r['prediction']}" for r in rows]
  path.write_text("\n".join(lines) + "\n")
  return path
