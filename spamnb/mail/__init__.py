"""Mail: raw bytes to namespaced tokens, and the places messages are read from.

``mime`` (parts, decoding, caps) -> ``html_text`` and ``lexer`` -> ``tokenizer``;
``sources`` lists and reads maildirs, mboxes, MH folders, archives and TREC indexes.
Knows nothing of models: the lowest layer above :mod:`spamnb.verdict`.
"""
