"""``python -m deploy`` runs the deploy command line."""

import sys

from deploy.sidecar.cli import main

sys.exit(main())
