"""The version of attnlab: written into every run's marker and reported by `attnlab --version`."""

__version__ = "0.1.0"
