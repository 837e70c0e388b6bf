"""The metrics.jsonl keys rlcli reads or writes: the contract between the trainers, eval, notebooks and tests.

The cookbook's recipes write most of them; rlcli adds the optim/ pair (rlcli.train.stats). A key the
cookbook renames is caught by rlcli.train.hooks, which checks the recipes' sources for BATCH and
TRAIN_NLL at import.
"""

BATCH = "progress/batch"  # the RL recipe's step index: present on every training step's row
TIME = "time/total"  # the RL recipe's own time for a step, sampling to optim_step
TRAIN_NLL = "train_mean_nll"  # the SL recipe's per-step training loss
TEST_NLL = "test/nll"  # the SL recipe's held-out loss (--test-size)
TOKENS, LR, EPOCH = "num_tokens", "learning_rate", "epoch"  # the SL recipe's
REWARD, CORRECT = "env/all/reward/total", "env/all/correct"  # the RL recipe's, on the training batch
TEST_REWARD, TEST_CORRECT = f"test/{REWARD}", f"test/{CORRECT}"  # its RLTestSetEvaluator's, on held-out problems
LOSS, CLIP = "optim/loss", "optim/clip_fraction"  # rlcli's: the server's objective, and the share clipped
TEACHER_KL = "teacher_kl"  # the distillation loop's: mean student - teacher logprob over sampled tokens
TEST_TEACHER_KL = f"test/{TEACHER_KL}"  # rlcli's, the same on held-out prompts (rlcli.train.distill_loop)
SAMPLED_TOKENS = "env/all/ac_tokens_per_turn"  # the RL recipes': mean sampled length
DPO_LOSS, ACCURACY, MARGIN = "dpo_loss", "accuracy", "margin"  # the DPO recipe's, on a step's pairs before its update
CHOSEN_REWARD, REJECTED_REWARD = "chosen_reward", "rejected_reward"  # its beta * (policy - reference) logprob, means
