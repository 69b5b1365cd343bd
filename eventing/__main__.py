import sys

from eventing.cli.app import main

sys.exit(main())
