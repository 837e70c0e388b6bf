"""`rlcli loop`: continual learning over one folder, from new trace files to a promoted model.

commands.py    the commands, the folder lock, one iteration's driver
settings.py    loop.toml: the settings, written and read (tomllib)
ledger.py      ledger.sqlite: files, conversations, iterations, stages, runs, problems' slices, scores, the alias
data.py        ingest (rlcli import, each file once, every line counted) and split (held out by prompt hash)
slices.py      each problem's slice: a tag the log carries, its masked prompt template, or the file that brought it
evaluation.py  the plan per slice, power before training, champion and candidate scored in batched requests
stages.py      train (sft, rl, distill from the champion, resumable), promote (export, hook)
gate.py        the exact per-slice interval, the error rate across slices, power, the decisions (pure)
report.py      `loop status` and `loop history`
batches.py     deterministic trace batches and a regression set (tests, the notebook, a first try)
"""
