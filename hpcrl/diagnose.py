"""``python -m hpcrl.diagnose``: the command; the code is :mod:`hpcrl.tools.diagnose`."""

import sys

from hpcrl.tools.diagnose import main

if __name__ == "__main__":
    sys.exit(main())
