"""The crash-safe file helpers: which temp files belong to a live writer."""

import os
import subprocess
import sys

from steersman.tensordict.files import temp_writer_alive


def test_temp_writer_alive_reads_the_pid_from_the_right():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in (f".ckpt-000001.{child.pid}.0a1b.tmp", f".summary.json.{child.pid}.0a1b.tmp",
                     f".LATEST.{child.pid}.0a1b.tmp"):
            assert temp_writer_alive(name), name
    finally:
        child.kill()
        child.wait()
    assert not temp_writer_alive(f".summary.json.{child.pid}.0a1b.tmp")  # the writer is gone
    assert not temp_writer_alive(f".summary.json.{os.getpid()}.0a1b.tmp")  # this process: not another writer
    assert not temp_writer_alive(".summary.tmp") and not temp_writer_alive(".a.b.tmp")  # no pid: dead
