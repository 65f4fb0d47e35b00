"""Delivery: what a mail system talks to.

``hook`` inserts the verdict's header lines into a message; ``fastfilter`` is
``spamnb filter``'s client (server, else compiled scorer, else the click
command); ``server`` and ``wire`` are the resident filter; ``maildir_sort``
files messages out of a maildir. Every decision they make comes from
:mod:`spamnb.verdict`.
"""
