"""Migration scripts (a package only so that the wheel ships them; Alembic skips this file)."""
