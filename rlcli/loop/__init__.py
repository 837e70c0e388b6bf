"""`rlcli loop`: continual learning over one folder, from new trace files to a promoted model.

commands.py  the commands, the folder lock, one iteration's driver
settings.py  loop.toml: the settings, written and read (tomllib)
ledger.py    ledger.sqlite: files, conversations, iterations, stages, runs, scores, the champion alias
data.py      ingest (rlcli import, each file once, every line counted) and split (held out by prompt hash)
stages.py    train (sft, rl, distill from the champion, resumable), evaluate, promote (export, hook)
score.py     champion and candidate answer the same problems; per-problem scores
gate.py      the paired bootstrap interval and the auto gate's decision (pure)
report.py    `loop status` and `loop history`
batches.py   deterministic trace batches and a regression set (tests, the notebook, a first try)
"""
