"""Check this machine and the server, one line per check (the same function as `rlcli doctor`).

    python scripts/doctor.py
    python scripts/doctor.py --base-url http://127.0.0.1:8000
"""

from rlcli.doctor import doctor
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main(doctor)
