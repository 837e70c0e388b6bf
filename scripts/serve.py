"""Run SkyRL's Tinker API server on this machine (the same functions as `rlcli serve`).

    python scripts/serve.py start                       # embedded tiny model, jax backend, CPU
    python scripts/serve.py start --base-model Qwen/Qwen3-4B-Instruct-2507 --backend fsdp --gpus 8
    python scripts/serve.py start --processes 2         # jax over 2 processes (JAX distributed runtime)
    python scripts/serve.py worker --coordinator HOST:PORT --processes N --process-id K
    python scripts/serve.py status | logs | stop | restart | install
"""

from rlcli.scripting import fire_main
from rlcli.server import commands

if __name__ == "__main__":
    fire_main({
        "start": commands.start,
        "stop": commands.stop,
        "status": commands.status,
        "logs": commands.logs,
        "restart": commands.restart,
        "install": commands.install,
        "worker": commands.worker,
    })
