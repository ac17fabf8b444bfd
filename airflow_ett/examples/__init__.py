"""Example data and the demo job definition (shipped with the package)."""
