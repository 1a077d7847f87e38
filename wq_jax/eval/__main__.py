"""`python -m wq_jax.eval`: a benchmark through `generate`, resumable, on every local device.

    python -m wq_jax.eval --task nextqa --data DIR --ckpt DIR --method windowquant \\
        [--config key=value ...] [--frames N] [--batch-size B] [--limit K] \\
        --output results.jsonl [--compare fp16 rtn2 windowquant ...] [--scoring generate|loglik]

A method may carry its own settings, `windowquant:alpha=1,reorder=false`;
`--config` applies to every method whose config has the key. Rows go to
--output (see wq_jax.eval.runner), the summary to <output>.summary.json, and,
for EgoSchema questions without public answers, a submission file per method
to <output>.<method>.submission.csv.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import jax

import wq_jax
from wq_jax import methods, parallel
from wq_jax.api import DEFAULT_FRAMES
from wq_jax.eval import runner, tasks


def _coerce(text: str, like):
  if isinstance(like, bool):
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
      raise ValueError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")
  return type(like)(text)


def _pairs(items) -> dict[str, str]:
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"a config setting is key=value, got {item!r}")
    out[key.strip()] = value.strip()
  return out


def _fields(name: str) -> set[str]:
  return {f.name for f in dataclasses.fields(methods.get_method(name).default_config)}


def method_config(entry: str, shared: dict[str, str]):
  """(method, config or None, label) of 'method' or 'method:key=value,...' plus the shared settings."""
  name, _, own = entry.partition(":")
  default = methods.get_method(name).default_config
  fields = _fields(name)
  own_pairs = _pairs(own.split(",")) if own else {}
  if set(own_pairs) - fields:
    raise ValueError(f"{name}'s config ({type(default).__name__}) has no {sorted(set(own_pairs) - fields)}; "
                     f"it has {sorted(fields)}")
  settings = {**{k: v for k, v in shared.items() if k in fields}, **own_pairs}
  if not settings:
    return name, None, name
  values = {k: _coerce(v, getattr(default, k)) for k, v in settings.items()}
  return name, dataclasses.replace(default, **values), name + ":" + ",".join(f"{k}={v}" for k, v in settings.items())


def build_runs(args) -> list[runner.RunConfig]:
  shared = _pairs(args.config)
  configs = [method_config(e, shared) for e in args.compare or [args.method]]
  unused = set(shared) - set().union(*(_fields(name) for name, _, _ in configs))
  if unused:
    raise ValueError(f"no method of this run has the config keys {sorted(unused)}")
  frames = args.frames if args.frames else (None if args.task == "milebench" else DEFAULT_FRAMES)
  return [runner.RunConfig(task=args.task, method=m, config=c, label=label, num_frames=frames,
                           batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, scoring=args.scoring,
                           attention=args.attention) for m, c, label in configs]


def summary_path(output: Path) -> Path:
  return output.with_suffix(".summary.json")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m wq_jax.eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--task", required=True, choices=sorted(tasks.TASKS))
  parser.add_argument("--data", required=True, help="the benchmark's folder (see wq_jax.eval.tasks)")
  parser.add_argument("--ckpt", required=True, help="a folder written by `python -m convert`")
  parser.add_argument("--method", default="windowquant", help="method[:key=value,...]")
  parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                      help="method config settings, e.g. alpha=2 window_size=32 reorder=false")
  parser.add_argument("--compare", nargs="+", default=None, metavar="METHOD",
                      help="run these methods (method[:key=value,...]) and print them side by side")
  parser.add_argument("--frames", type=int, default=None,
                      help=f"frames sampled from each video (default {DEFAULT_FRAMES}; MileBench: all its images)")
  parser.add_argument("--batch-size", type=int, default=1)
  parser.add_argument("--limit", type=int, default=None, help="only the first K questions")
  parser.add_argument("--output", required=True, type=Path, help="results JSONL (appended to, resumable)")
  parser.add_argument("--scoring", default="generate", choices=["generate", "loglik"])
  parser.add_argument("--max-new-tokens", type=int, default=16)
  parser.add_argument("--split", default=None, help="nextqa/intentqa: test or val; egoschema: full or subset")
  parser.add_argument("--subtasks", nargs="+", default=None, help="MVBench / MileBench tasks to run")
  parser.add_argument("--attention", default="xla", help="decode attention: xla or pallas")
  parser.add_argument("--retry-errors", action="store_true", help="run the error rows of --output again")
  parser.add_argument("--no-progress", action="store_true")
  args = parser.parse_args(argv)
  if args.batch_size < 1:
    parser.error("--batch-size must be at least 1")

  try:
    runs = build_runs(args)
    questions = tasks.load(args.task, args.data, split=args.split, subtasks=args.subtasks)[: args.limit]
  except (ValueError, FileNotFoundError) as e:
    parser.error(str(e))
  model = wq_jax.load(args.ckpt)
  mesh = parallel.data_mesh() if jax.local_device_count() > 1 else None
  if mesh is not None:
    model = parallel.replicate(model, mesh)
    print(f"data parallel over {parallel.data_size(mesh)} devices", file=sys.stderr)
  print(f"{args.task}: {len(questions)} questions", file=sys.stderr)

  rows = []
  for cfg in runs:
    rows += runner.run_task(model, questions, cfg, args.output, mesh=mesh, retry_errors=args.retry_errors,
                            progress=not args.no_progress)
  summary = runner.summarize(rows)
  path = summary_path(args.output)
  path.write_text(json.dumps({"task": args.task, "data": str(args.data), "ckpt": str(args.ckpt),
                              "questions": len(questions), "methods": summary}, indent=1))
  print(runner.comparison_table(summary))
  print(f"rows in {args.output}, summary in {path}", file=sys.stderr)
  if any(q.answer is None for q in questions):
    for cfg in runs:
      safe = re.sub(r"[^\w.=-]+", "_", cfg.name)
      sub = runner.write_submission([r for r in rows if r["method"] == cfg.name],
                                    args.output.with_name(f"{args.output.stem}.{safe}.submission.csv"))
      print(f"submission file: {sub}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
