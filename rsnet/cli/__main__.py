"""``python -m rsnet.cli``: the same as the ``rsnet`` console script."""

import sys

from . import main

sys.exit(main())
