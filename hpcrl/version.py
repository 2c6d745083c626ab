"""The package version (one home: ``hpcrl.__version__`` re-exports it, and the modules that
record it in metrics files, manifests and exported policies import it from here)."""

__version__ = "0.1.0"
