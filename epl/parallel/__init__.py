"""Planner, rewrite passes and the TensorFlow integration hooks."""
