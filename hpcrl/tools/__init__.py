"""Tools for after (and during) a run: ``analyze`` (results against the published tables),
``diagnose`` (dead units from a checkpoint), ``config_reference`` (docs/configuration.md)."""
