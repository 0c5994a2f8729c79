"""Pure functions from a Profile to the derived tables and verdicts every report shows."""
