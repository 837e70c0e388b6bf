"""The embedded tiny model (the same functions as `rlcli model install|build`).

    python scripts/model.py install                 # the shipped bytes into RLCLI_HOME; prints the folder
    python scripts/model.py build --seed 0          # rerun the recipe (~75 s) and compare with the shipped bytes
"""

from rlcli.model import install
from rlcli.model.recipe import build
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main({"install": install, "build": build})
