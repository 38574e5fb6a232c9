"""The stage loop's config: `defaults.base()` (every field and its default) and `schema` (each
field's type and legal values, checked before any work). Experiment files (`configs/*.py` in the
repository) start from `base()` and change what differs."""
