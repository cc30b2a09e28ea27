"""``python -m hubless`` runs the same command line as ``hubless``."""

from hubless.cli.main import app

if __name__ == "__main__":
    app(prog_name="hubless")
