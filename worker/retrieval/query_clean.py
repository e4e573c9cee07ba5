"""The retrieval query of a question: the question without its answer-format instructions.

Questions about documents often end with instructions for the answer rather than words of
the page that holds it: "Please write the answer in the list format and with alphabetical
order, e.g., ["A","B"]", "Round your answer to two decimal places.", "Answer 'yes' or
'no'.", "Format the date as YYYY-MM-DD". Those words ("write", "list", "format", "order",
"decimal", "answer") match pages that merely contain them and move the question's dense
vector away from its topic. `retrieval_query` drops them before ranking; the question
itself (what the model reads) is unchanged (measured on the real dev set:
lab/retrieval/NOTES.md).

What is dropped, and only that:

- an example of the answer's shape: "e.g." or "for example" followed by a bracketed list;
- every sentence after the first that is not itself a question (does not end in "?") and
  either opens with an answer instruction ("Please", "Write", "Round", "Answer", "Format",
  "Save", "Give", "Return", "Express", "Directly", "Respond", "Reply", "Output") or speaks
  of the answer's format ("format", "decimal", "YYYY").

The first sentence is always kept, so a question that is one instruction ("Write the filing
id of this case") stays whole; a question with nothing to drop is returned unchanged.
"""

from __future__ import annotations

import re

_EXAMPLE = re.compile(r",?\s*\b(?:e\.g\.|for example)[,:]?\s*\[[^\]]*\]\s*\.?", re.IGNORECASE)
# sentence ends: after . ! ? followed by space, and after a "?" glued to the next word
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=\?)(?=[A-Za-z])")
_INSTRUCTION = re.compile(
    r"^(?:please|kindly|write|round|answer|format|save|give|return|express|directly|respond|"
    r"reply|output)\b", re.IGNORECASE)
_FORMAT_WORDS = re.compile(r"\bformat(?:ted)?\b|\bdecimals?\b|\byyyy\b", re.IGNORECASE)


def retrieval_query(question: str) -> str:
    """`question` without its answer-format instructions (see the module docstring), with
    runs of white space collapsed when anything was dropped."""
    text = _EXAMPLE.sub(" ", question)
    sentences = [s for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    if not sentences:
        return question
    kept = sentences[:1] + [s for s in sentences[1:] if not _is_instruction(s)]
    if text == question and len(kept) == len(sentences):
        return question
    return " ".join(" ".join(kept).split())


def _is_instruction(sentence: str) -> bool:
    s = sentence.strip()
    if s.endswith("?"):
        return False
    return bool(_INSTRUCTION.match(s) or _FORMAT_WORDS.search(s))
