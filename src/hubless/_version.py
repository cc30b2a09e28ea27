"""The version of hubless (``hubless.__version__``), here so that any layer can read it without
importing the package's public face."""

__version__ = "0.1.0"
