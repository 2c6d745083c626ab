"""``python -m hpcrl.play``: the command; the code is :mod:`hpcrl.tools.play`."""

import sys

from hpcrl.tools.play import main

if __name__ == "__main__":
    sys.exit(main())
