"""rlcli's management of SkyRL's Tinker API server: venv, process, launcher."""
