"""The ``hubless`` command line: thin wrappers over the library."""
