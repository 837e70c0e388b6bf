"""Harbor tasks in local Docker: run them, grade them, and train agents on them.

tasks.py    task folders and task.toml (limits, timeouts), datasets: a folder, or NAME@VERSION via Harbor's registry
taskconfig.py  task.toml as Harbor 0.25 reads it: network per phase, steps, env tables, what rlcli cannot apply
images.py   one image per task content (a hash of environment/), its build context never left on disk; a task
            whose image cannot be made is reported and left out
sandbox.py  one container per rollout through the docker SDK: limits, labels, in-container command
            timeouts, removal (also after Ctrl-C; a sweep of dead runs' leftovers)
phases.py   a rollout's steps in Harbor's order (setup, agent, verifier), each phase on its own network
verify.py   the verifier: tests/ in the container, test.sh, the rewards as Harbor reads them (reward.json,
            else reward.txt) and the one number RL uses; grading errors counted
agent.py    the rollout: the model's bash-tool conversation (a tinker-cookbook Env), the oracle and nop
            policies, the trajectory record
dataset.py  the cookbook's dataset of task groups and its builder (config.json holds its plain fields)
train.py    `rlcli train harbor`: the cookbook's RL loop over dataset.py, with `train rl`'s loss handling
run.py      `rlcli harbor run`: oracle, nop or model rollouts graded without training
summary.py  `harbor run`'s closing table
cookbook_sandbox.py  tinker-cookbook's SandboxInterface on rlcli's sandboxes, for the cookbook's Harbor recipe

Nothing heavy is imported here or at the top of train.py and run.py: `rlcli --help` stays fast.
"""
