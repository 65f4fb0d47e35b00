"""Naive Bayes: the estimators, their sparse kernels, the Bayes decision, the vocabulary.

Generic text classification: nothing here knows about mail. The theory each
formula comes from is ``docs/naive-bayes.md``.
"""
