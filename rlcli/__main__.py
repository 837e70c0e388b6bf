from rlcli.cli import entry

entry()
