import sys

from dse.cli import main

sys.exit(main())
