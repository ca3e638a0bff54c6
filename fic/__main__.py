import sys

from fic.cli.main import main

sys.exit(main())
