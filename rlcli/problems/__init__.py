"""What a model is asked and how its answers are scored: problem sets, held-out rules, rewards, the one scorer.

heldout.py   which problem set the flags name, the problems it holds out of training, what a run trains on
envs.py      the problem sets (arithmetic, gsm8k, a file) as tinker-cookbook dataset builders
traces.py    imported traces as problems: turns, sources, skips counted, held out by prompt hash
replay.py    `--env replay|tools` as cookbook envs and dataset builders over those problems
rewards.py   the match, verdict and rubric rewards, the format penalty and the echo guard (pure)
judge.py     `--reward judge`: a judge model ranks each group (its prompt: judge_prompt_v1.txt)
tools_env.py `--env tools`: logged calls answer with recorded outputs; precision/recall; oracle/nop
score.py     the one scorer: a model answers problems, each graded by its env (`rlcli eval`, the loop's gate)
synth.py     `rlcli synth qa`: {question, answer} problems from traces with checkable answers
Trainers (rlcli.train) train on these; nothing here imports a trainer. envs, replay and score import the
cookbook at the top: the others stay light.
"""
