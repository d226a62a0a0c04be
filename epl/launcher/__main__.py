"""`python -m epl.launcher ...` runs epl-launch."""
import sys

from epl.launcher.cli import main

if __name__ == "__main__":
    sys.exit(main())
