"""What needs no running Ray: the import stays lazy, a missing ray and a dead address are
clear errors."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest


def test_import_does_not_import_ray_and_use_without_ray_names_the_extra():
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if ray were not installed
        "import steersman.distributed as d\n"
        "assert 'ray' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "from steersman.envs import CartPoleEnv\n"
        "try:\n"
        "    d.RayCollector(CartPoleEnv, frames_per_batch=8, total_frames=8)\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'steersman[ray]'" in out.stdout


def test_dead_address_fails_within_seconds():
    pytest.importorskip("ray")
    from steersman.distributed import init_ray

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"no Ray cluster answers at 127.0.0.1:{port}.*ray start --head"):
        init_ray(address=f"127.0.0.1:{port}", connect_timeout=2.0)
    assert time.monotonic() - t < 10
