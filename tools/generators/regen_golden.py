#!/usr/bin/env python3
"""Rewrite tests/golden/*.tokens from tests/golden/*.eml with the default tokenizer.

Run this deliberately, after an intended tokenizer change, and review the
diff (``git diff tests/golden``) before committing: the golden files are the
record of what the tokenizer emits for real mail.

    python3 tools/generators/regen_golden.py [--check]

``--check`` rewrites nothing and exits 1 if any .tokens file would change.
"""

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from spamnb.mail.tokenizer import DEFAULT_CONFIG, tokenize  # noqa: E402

GOLDEN = ROOT / "tests" / "golden"


def render(tokens):
    """One token per line, UTF-8, trailing newline (tokens never hold newlines)."""
    return "".join(t + "\n" for t in tokens)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report differences")
    args = ap.parse_args(argv)
    changed = []
    for eml in sorted(GOLDEN.glob("*.eml")):
        text = render(tokenize(eml.read_bytes(), DEFAULT_CONFIG))
        target = eml.with_suffix(".tokens")
        old = target.read_text(encoding="utf-8") if target.exists() else None
        if old != text:
            changed.append(target.name)
            if not args.check:
                target.write_text(text, encoding="utf-8")
    verb = "differ" if args.check else "rewritten"
    print("%d golden file(s) %s%s" % (len(changed), verb, (": " + ", ".join(changed)) if changed else ""))
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
