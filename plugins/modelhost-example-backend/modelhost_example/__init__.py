"""A minimal modelhost backend plugin ("example"): OUTPUT = INPUT * factor."""
