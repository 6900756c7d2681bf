"""Prompt datasets and the built-in tasks."""
