import sys

from fic.cli import main

sys.exit(main())
