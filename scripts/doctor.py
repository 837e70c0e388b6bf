"""Check this machine and the server, one line per check (the same command as `rlcli doctor`).

    python scripts/doctor.py
    python scripts/doctor.py --base-url http://127.0.0.1:8000
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("doctor")
