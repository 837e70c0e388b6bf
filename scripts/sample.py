"""Sample from a sampler checkpoint or the base model (the same commands as `rlcli sample` / `rlcli chat`).

    python scripts/sample.py sample --checkpoint tinker://RUN/sampler_weights/ID --prompt "What is 2 + 3?" --n 2
    python scripts/sample.py chat --checkpoint tinker://RUN/sampler_weights/ID
    printf 'hi\\nWhat is 2 + 3?\\n' | python scripts/sample.py chat --base-url http://127.0.0.1:8000
"""

from rlcli.scripting import launch_one_of

if __name__ == "__main__":
    launch_one_of({"sample": ("sample",), "chat": ("chat",)})
