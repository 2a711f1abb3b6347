"""``python -m steersman``: the ``steersman`` command (see :mod:`steersman.cli`)."""

import sys

from steersman.cli import main

sys.exit(main())
