"""Video QA benchmarks through `wq_jax.generate`: loaders, scoring, a resumable data-parallel runner.

    tasks     NExT-QA, IntentQA, EgoSchema, MVBench, MileBench files -> `Question`s
    media     a question's video, frame folder or images -> uint8 frames
    scoring   the reply (or the letters' logits) -> the chosen option, and its score
    runner    batches over a mesh, one JSONL row a question, summaries

`python -m wq_jax.eval --help` runs one; README.md here says how to reproduce the paper's tables.
"""
from wq_jax.eval.runner import RunConfig, comparison_table, read_rows, run_task, summarize
from wq_jax.eval.tasks import TASKS, Media, Question, load

__all__ = ["RunConfig", "comparison_table", "read_rows", "run_task", "summarize", "TASKS", "Media", "Question",
           "load"]
