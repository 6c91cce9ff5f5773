import sys

from d2ops.cli import main

sys.exit(main())
