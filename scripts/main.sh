#!/usr/bin/env bash
# The README's main job: set up, train a model on the shipped SpamAssassin
# corpus, classify the held-out sample maildir, printing the table, and end
# with how that compares with the sample's gold labels.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
mkdir -p out
.venv/bin/spamnb train --index corpora/spamassassin.tar.xz --model out/model.joblib
.venv/bin/spamnb classify --model out/model.joblib corpora/sample-maildir | tee out/sample-maildir.txt
echo
.venv/bin/python scripts/against_gold.py out/sample-maildir.txt corpora/sample-maildir.index
