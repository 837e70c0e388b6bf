"""Training commands over tinker-cookbook's loops. Adding a trainer means adding one file beside these.

run.py       the skeleton every trainer runs through: run folder, resume check, model and renderer,
             slot hygiene, progress line, final report; the defaults they share
folder.py    a run folder: its lock, run info, checkpoints.jsonl, the models it holds, private data copies
hooks.py     every hook into tinker and tinker-cookbook, checked against the pinned versions at import
sl.py        `rlcli train sl`: supervised fine-tuning on chat JSONL
rl.py        `rlcli train rl`: RL with a server-side loss; rl_loop.py: what it shares with `train harbor`
distill.py   `rlcli train distill`: on-policy distillation; distill_loop.py its loop, teacher.py its teacher
losses.py    loss names, what each backend serves, GSPO's reference and exact 2-pass route
stats.py     each RL step's loss and clip fraction; metrics.py: the metrics.jsonl keys
renderers.py which renderer and tokenizer a model gets; a dry render of the data
Problem sets, held-out rules and rewards live in rlcli.problems. Nothing heavy is imported here:
`rlcli train sl --help` must stay fast.
"""
