"""Answer accuracy on real documents (`conduit-lab eval answers`), graded like MMLongBench-Doc.

One concept per module: `questions` (the input form), `grading` (the benchmark's rules),
`corpus` (ingest through the normal pipeline), `runner` (reference + every policy x budget,
resumable), `results` (records and rows), `report` (markdown and PNG).

Public API:
  AnswerEvalConfig, run_answer_eval(config) -> dict, BudgetOneError, resolve_policies
"""

from lab.answers.runner import (
    AnswerEvalConfig,
    BudgetOneError,
    resolve_policies,
    run_answer_eval,
)

__all__ = ["AnswerEvalConfig", "BudgetOneError", "resolve_policies", "run_answer_eval"]
