"""The checks a setting's value must pass, once: what ``config --check`` applies
to a file and what every command applies at start are these same functions.

Standard library only, and nothing imported at module level beyond ``os``:
the filter's cold path may import this. Each check takes a value as a file or an
option gives it and returns it as the command uses it, or raises ``ValueError``
with a short sentence that names what is wrong (the caller adds FILE:LINE or the
option's name).

:data:`CHECKS` maps a configuration key ``(table, key)`` to its check, for the
keys whose value needs more than its type.
"""

import os  # noqa: F401  (the checks of paths and modes use it)

#: ``(table, key)`` -> check(value) -> value, raising ValueError.
CHECKS = {}
