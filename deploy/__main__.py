"""``python -m deploy`` runs the deploy command line."""

import sys

from deploy.cli import main

sys.exit(main())
