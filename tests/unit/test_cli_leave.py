"""rlcli.cli.leave: a process that ran the tinker client exits with its code after joining its threads, running its
atexit handlers and flushing its output, and skips the interpreter's finalization (where the client's native
threads can abort it); one that never loaded the client exits the ordinary way."""

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time, types
    from pathlib import Path
    from rlcli.cli import leave

    out = Path(sys.argv[1])
    if sys.argv[2] == "client":
        sys.modules["tinker"] = types.ModuleType("tinker")  # what a command that used the client has loaded

    class Finalized:
        def __del__(self):
            (out / "finalized").write_text("yes")

    kept = Finalized()  # dropped only when the interpreter finalizes
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
    from concurrent.futures import ThreadPoolExecutor
    ThreadPoolExecutor(2).submit(lambda: None).result()  # its idle worker waits for the exit to tell it to stop
    sys.stdout.write("no newline, still buffered")
    leave(3)
""")


@pytest.mark.parametrize("loaded", ["client", "none"])
def test_leave_exits_with_the_code_after_threads_atexit_and_output(tmp_path, loaded):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path), loaded], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"  # a non-daemon thread finished before the exit
    if loaded == "client":
        assert not (tmp_path / "finalized").exists()  # no finalization: no native thread can call back into it
