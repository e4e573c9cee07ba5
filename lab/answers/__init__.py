"""Answer accuracy on real documents (`conduit-lab eval answers`), graded like MMLongBench-Doc.

One concept per module: `questions` (the input form), `grading` (the benchmark's rules),
`corpus` (ingest through the normal pipeline), `config` (a run's configuration and its
checks), `runner` (reference + every policy x budget, resumable), `results` (records and
rows), `report` (markdown and PNG), `cli` (the command's options; importing it loads no model
code).

Public API:
  `lab.answers.config`: AnswerEvalConfig, resolve_policies, PAGES_MODES
  `lab.answers.runner`: run_answer_eval(config) -> dict, BudgetOneError
"""
