"""Run SkyRL's Tinker API server on this machine (the same commands as `rlcli serve`).

    python scripts/serve.py start                       # embedded tiny model, jax backend, CPU
    python scripts/serve.py start --base-model Qwen/Qwen3-4B-Instruct-2507 --backend fsdp --gpus 8
    python scripts/serve.py start --processes 2         # jax over 2 processes (JAX distributed runtime)
    python scripts/serve.py worker --coordinator HOST:PORT --processes N --process-id K
    python scripts/serve.py status | logs | stop | restart | install
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("serve")
