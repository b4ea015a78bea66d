"""``python -m multistart ...`` is the ``multistart`` command."""

import sys

from .cli import main

sys.exit(main())
