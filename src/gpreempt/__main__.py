"""``python -m gpreempt`` is the ``gpreempt`` command."""

import sys

from .cli import main

sys.exit(main())
