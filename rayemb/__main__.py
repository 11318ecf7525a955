"""``python -m rayemb ...`` is the ``rayemb`` command."""

import sys

from rayemb.cli import main

sys.exit(main())
