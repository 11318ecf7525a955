"""``python -m rayemb.cli ...`` is the ``rayemb`` command."""

import sys

from rayemb.cli import main

sys.exit(main())
