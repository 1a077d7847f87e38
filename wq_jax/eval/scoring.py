"""Scoring answers: multiple choice by the generated letter, or by the letters' log-likelihood.

Multiple choice (the default, `parse_choice`). The options are shown labelled
with letters ("A. ...") and the prompt asks for the option's letter, as
LLaVA-OneVision's and Qwen2-VL's own evaluations (lmms-eval) do. The reply is
matched back to an option with lmms-eval's NExT-QA rule
(`parse_multi_choice_response`, taken from MMMU), in this order:

  0. the whole reply is one option's text (case-insensitive)  -> that option
  1. "(B)" somewhere in the reply                              -> B
  2. "B " (the reply padded with spaces, outer punctuation off) -> B
  3. "B."                                                       -> B
  4. a reply of more than five words that contains an option's text -> that option
  several candidates at one step: the one that occurs last.

Why this rule: it is what produced the published numbers of the models the
paper evaluates (NExT-QA with lmms-eval), it accepts the bare letter the
prompt asks for as well as "(B) text" and "B. text", and it falls back to the
option's text for a chatty reply. Two changes, both to make runs comparable
across KV methods: step 0 (EgoSchema's lmms-eval rule) is added, and a reply
that matches nothing is no prediction (counted wrong) where lmms-eval picks a
random letter. Every task uses this one rule; MVBench's and MileBench's own
scorers differ only on replies that are neither a letter nor an option.

Log-likelihood (`choice_from_logits`, `--scoring loglik`): the option whose
letter token has the highest logit as the first answer token. The first token
comes from the full-precision prefill (SPEC §3), so this scoring does not
depend on the KV method: it is the reference the generated answers of the
quantized caches are compared against, and a check that the prompt works.

Open-ended MileBench tasks are scored as MileBench's `evaluate.py` does:
ROUGE-L F (the `rouge` package's summary-level form) after MileBench's text
normalisation, and for the needle tasks whether the answer appears in the reply.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

LETTERS = "ABCDEFGHIJ"
_OUTER_PUNCT = (",", ".", "!", "?", ";", ":", "'")


def option_lines(options: Sequence[str], template: str = "{letter}. {option}") -> str:
  """The options one per line, labelled A, B, ... with `template`."""
  return "\n".join(template.format(letter=LETTERS[i], option=o) for i, o in enumerate(options))


def parse_choice(reply: str, options: Sequence[str]) -> int | None:
  """The option index the reply names (module docstring), or None when it names none."""
  letters = LETTERS[: len(options)]
  texts = [o.strip() for o in options]
  whole = reply.strip().rstrip(".").strip().lower()
  for i, text in enumerate(texts):
    if whole and whole == text.rstrip(".").lower():
      return i
  for char in _OUTER_PUNCT:
    reply = reply.strip(char)
  padded = f" {reply} "
  for pattern in ("({})", "{} ", "{}."):
    found = [l for l in letters if pattern.format(l) in padded]
    if found:
      last = pattern.format("{}") if pattern != "{} " else " {} "
      return letters.index(max(found, key=lambda l: padded.rfind(last.format(l))))
  if len(padded.split()) > 5:
    lower = padded.lower()
    found = [i for i, text in enumerate(texts) if text and text.lower() in lower]
    if found:
      return max(found, key=lambda i: lower.rfind(texts[i].lower()))
  return None


def letter_token_ids(tokenizer, count: int) -> list[int]:
  """The token id of each option letter as the first answer token (each must be one token)."""
  ids = []
  for letter in LETTERS[:count]:
    tokens = tokenizer.encode(letter, add_special_tokens=False)
    if len(tokens) != 1:
      raise ValueError(f"the tokenizer splits the option letter {letter!r} into {tokens}: "
                       "log-likelihood scoring needs one token per letter")
    ids.append(tokens[0])
  return ids


def choice_from_logits(logits: np.ndarray, letter_ids: Sequence[int]) -> int:
  """The option whose letter has the largest first-token logit (logits [V])."""
  return int(np.argmax(np.asarray(logits)[list(letter_ids)]))


# ----------------------------------------------------------------------------- open-ended (MileBench)

_PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_COMMA_NUMBER = re.compile(r"(\d)(,)(\d)")
_PERIOD = re.compile(r"\.(?!\d)")


def normalize(text: str) -> str:
  """MileBench's answer normalisation: punctuation off, periods off (not in numbers), lower case."""
  text = text.replace("\n", " ").replace("\t", " ").strip()
  out = text
  for p in _PUNCT:
    glued = not (p + " " in text or " " + p in text or _COMMA_NUMBER.search(text))
    out = out.replace(p, " " if glued else "")
  out = _PERIOD.sub("", out)
  return out.strip().strip("'").strip('"').strip().lower()


def _lcs_words(x: list[str], y: list[str]) -> list[str]:
  """One longest common subsequence of x and y, as the `rouge` package reconstructs it."""
  table = np.zeros((len(x) + 1, len(y) + 1), np.int32)
  for i in range(1, len(x) + 1):
    for j in range(1, len(y) + 1):
      table[i, j] = table[i - 1, j - 1] + 1 if x[i - 1] == y[j - 1] else max(table[i - 1, j], table[i, j - 1])
  out, i, j = [], len(x), len(y)
  while i > 0 and j > 0:
    if x[i - 1] == y[j - 1]:
      out.append(x[i - 1])
      i, j = i - 1, j - 1
    elif table[i - 1, j] > table[i, j - 1]:
      i -= 1
    else:
      j -= 1
  return out[::-1]


def rouge_l(hypothesis: str, reference: str) -> float:
  """ROUGE-L F of the `rouge` package (summary level, sentences split on '.', distinct words)."""
  hyp = [" ".join(s.split()) for s in hypothesis.split(".") if s]
  ref = [" ".join(s.split()) for s in reference.split(".") if s]
  if not hyp or not ref:
    return 0.0
  words = lambda sentences: [w for s in sentences for w in s.split(" ")]
  union: set[str] = set()
  for r in ref:
    for h in hyp:
      union |= set(_lcs_words(r.split(" "), h.split(" ")))
  recall, precision = len(union) / len(set(words(ref))), len(union) / len(set(words(hyp)))
  return 2.0 * precision * recall / (precision + recall + 1e-8)


# ----------------------------------------------------------------------------- per-question metrics


def _choice(reply: str, options, answer) -> tuple[int | None, float | None]:
  pred = parse_choice(reply, options)
  return pred, (None if answer is None else float(pred == answer))


def _rouge(reply: str, options, answer) -> tuple[None, float]:
  reply, answer = normalize(reply), normalize(answer)
  return None, (rouge_l(reply, answer) if reply else 0.0)


def _needle(reply: str, options, answer) -> tuple[None, float]:
  return None, float(normalize(answer) in normalize(reply).split())


def _contains(reply: str, options, answer) -> tuple[None, float]:
  return None, float(normalize(answer) in normalize(reply))


# name -> (reply, options, answer) -> (predicted option index or None, score in [0, 1] or None)
METRICS: dict[str, Callable] = {"choice": _choice, "rouge_l": _rouge, "needle": _needle, "contains": _contains}
BINARY = ("choice", "needle", "contains")  # metrics whose score says right or wrong


def judge(metric: str, reply: str, options: Sequence[str], answer) -> tuple[int | None, float | None]:
  """(prediction, score) of a reply; score is None when the answer is not public."""
  return METRICS[metric](reply, options, answer)
