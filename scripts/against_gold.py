#!/usr/bin/env python3
"""How ``spamnb classify``'s verdicts compare with gold labels: the end of scripts/main.sh.

    python scripts/against_gold.py CLASSIFIED INDEX

CLASSIFIED is what ``spamnb classify`` printed (any ``--format``: the table,
tsv or jsonl; the table's header line is skipped), INDEX a TREC index
(``ham PATH`` / ``spam PATH`` lines, paths relative to the index's folder),
like ``corpora/sample-maildir.index``. Messages are matched by their real
paths: CLASSIFIED's paths are read relative to the current folder, as
``classify`` printed them. Every classified message must have a gold label and
every gold message must have been classified, else nothing is counted (exit 1).

Prints the confusion counts (gold ham and spam against filed ham, unsure and
spam), the accuracy (unsure mail counts as not filed right), false positives
(ham filed as spam) and false negatives (spam filed as ham; unsure spam is
counted apart). Standard library only.
"""

from __future__ import annotations

import json
import os
import sys

LABELS = ("ham", "unsure", "spam")


def read_classified(lines):
    """``{real path: label}`` from classify's output in any of its formats."""
    filed = {}
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("{"):  # jsonl
            row = json.loads(line)
            path, label = row["path"], row["label"]
        elif "\t" in line:  # tsv: path, label, probability, score
            path, label = line.split("\t")[:2]
        else:  # the table: label, P(spam), score, message
            parts = line.split(None, 3)
            if n == 1 and parts[:2] == ["label", "P(spam)"]:
                continue
            if len(parts) != 4:
                raise ValueError(f"line {n}: not a line of spamnb classify's output: {line!r}")
            label, path = parts[0], parts[3]
        if label not in LABELS:
            raise ValueError(f"line {n}: unknown label {label!r}")
        filed[os.path.realpath(path)] = label
    return filed


def read_index(index):
    """``{real path: gold label}`` of a TREC index."""
    folder = os.path.dirname(os.path.abspath(index))
    gold = {}
    with open(index, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            label, _, rel = line.strip().partition(" ")
            if label not in ("ham", "spam") or not rel:
                raise ValueError(f"{index}:{n}: not 'ham PATH' or 'spam PATH': {line.strip()!r}")
            gold[os.path.realpath(os.path.join(folder, rel.strip()))] = label
    return gold


def confusion(filed, gold):
    """``{gold label: {filed label: count}}``; ValueError when the two sets differ."""
    unknown = sorted(set(filed) - set(gold))
    missing = sorted(set(gold) - set(filed))
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} classified message(s) without a gold label (first: {unknown[0]})")
    if missing:
        problems.append(f"{len(missing)} gold message(s) not classified (first: {missing[0]})")
    if problems:
        raise ValueError("; ".join(problems))
    table = {g: {f: 0 for f in LABELS} for g in ("ham", "spam")}
    for path, label in filed.items():
        table[gold[path]][label] += 1
    return table


def pct(k, n):
    return f"{100 * k / n:.1f}%" if n else "-"


def report(table, index):
    n_ham, n_spam = sum(table["ham"].values()), sum(table["spam"].values())
    n = n_ham + n_spam
    right = table["ham"]["ham"] + table["spam"]["spam"]
    fp, fn = table["ham"]["spam"], table["spam"]["ham"]
    unsure = table["ham"]["unsure"] + table["spam"]["unsure"]
    return "\n".join([
        f"against the gold labels of {index} ({n} messages):",
        f"{'':<10}{'filed ham':>10}{'unsure':>8}{'spam':>6}",
        *(f"{'gold ' + g:<10}{table[g]['ham']:>10}{table[g]['unsure']:>8}{table[g]['spam']:>6}"
          for g in ("ham", "spam")),
        f"accuracy: {right} of {n} filed right ({pct(right, n)}; unsure mail counts as not right)",
        f"false positives (ham filed as spam): {fp} of {n_ham} ham ({pct(fp, n_ham)})",
        f"false negatives (spam filed as ham): {fn} of {n_spam} spam ({pct(fn, n_spam)})",
        f"unsure: {unsure} ({table['ham']['unsure']} ham, {table['spam']['unsure']} spam)",
    ])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) != 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    classified, index = argv
    try:
        with open(classified, encoding="utf-8") as f:
            filed = read_classified(f)
        table = confusion(filed, read_index(index))
    except (OSError, ValueError, KeyError) as exc:
        print(f"against_gold: error: {exc}", file=sys.stderr)
        return 1
    print(report(table, index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
