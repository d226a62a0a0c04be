"""``python -m epl.strategies.schedule``: print (and optionally draw) a pipeline schedule."""
import sys

from epl.strategies.schedule.picture import main

if __name__ == "__main__":
    sys.exit(main())
