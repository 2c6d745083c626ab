"""``python -m hpcrl.analyze``: the command; the code is :mod:`hpcrl.tools.analyze`."""

import sys

from hpcrl.tools.analyze import main

if __name__ == "__main__":
    sys.exit(main())
