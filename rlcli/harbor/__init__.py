"""Harbor tasks in local Docker: run them, grade them, and train agents on them.

tasks.py    task folders and task.toml (limits, timeouts), datasets: a folder, or NAME@VERSION via Harbor's registry
sandbox.py  one container per rollout through the docker SDK: images by content hash, limits, labels,
            in-container command timeouts, removal (also after Ctrl-C; a sweep of dead runs' leftovers)
agent.py    the rollout: the model's bash-tool conversation (a tinker-cookbook Env), the verifier, the
            reward as Harbor reads it, the trajectory record; the cookbook dataset of task groups
train.py    `rlcli train harbor`: the cookbook's RL loop over agent.py, with `train rl`'s loss handling
run.py      `rlcli harbor run`: oracle, nop or model rollouts graded without training

Nothing heavy is imported here or at the top of train.py and run.py: `rlcli --help` stays fast.
"""
