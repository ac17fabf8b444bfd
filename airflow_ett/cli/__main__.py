"""`python -m airflow_ett.cli`: the `airflow-ett` console script without its wrapper."""

import sys

from airflow_ett.cli import main

sys.exit(main())
