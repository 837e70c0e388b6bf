"""rlcli's benchmarks: each module measures real parts (a real server, real files, real processes) and writes a
JSON receipt under benchmarks/receipts/. Run one from the checkout's root as `python -m benchmarks.NAME`;
benchmarks/README.md lists them, says how `make bench` runs them and which receipts the tree keeps.

Not shipped in the wheel (pyproject packages only rlcli*): benchmarks run from a checkout.
"""
