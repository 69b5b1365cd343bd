import sys

from eventing.cli import main

sys.exit(main())
