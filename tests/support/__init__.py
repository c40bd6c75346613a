"""Helpers shared by the test suite: a real memd daemon in a subprocess."""
