"""``spamnb web``: a page to see what the filter did and to correct it.

:mod:`spamnb.web.data` reads the history (:mod:`spamnb.storage.history`) and
learns; :mod:`spamnb.web.pages` and :mod:`spamnb.web.charts` draw the HTML and
SVG; :mod:`spamnb.web.app` is the HTTP server and its access rules.
"""
