"""``python -m hpcrl.export``: the command; the code is :mod:`hpcrl.tools.export`."""

import sys

from hpcrl.tools.export import main

if __name__ == "__main__":
    sys.exit(main())
