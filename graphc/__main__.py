import sys

from graphc.cli import main

sys.exit(main())
