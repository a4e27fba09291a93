class TritonPythonModel:
    """Fails to load."""

    def initialize(self, args):
        raise RuntimeError("broken on purpose")
