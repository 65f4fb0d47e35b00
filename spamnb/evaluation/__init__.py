"""Evaluation: protocols (cross-validation, train/test, online), metrics, folds, plots."""
