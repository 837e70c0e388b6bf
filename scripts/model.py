"""The embedded tiny model (the same commands as `rlcli model install|build`).

    python scripts/model.py install                 # the shipped bytes into RLCLI_HOME; prints the folder
    python scripts/model.py build --seed 0          # rerun the recipe (~75 s) and compare with the shipped bytes
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("model")
