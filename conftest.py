"""Test-session settings shared by tests/ and the doctests under steersman/.

One torch thread per test process: the networks here are tiny, and with pytest-xdist
each worker would otherwise start one thread per core and the workers thrash each other
(tens of times slower on a 2-core machine).
"""

import torch

torch.set_num_threads(1)
