#!/usr/bin/env bash
# The README's main job: set up, train a model on the shipped SpamAssassin
# corpus, and classify the held-out sample maildir, printing the table.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
mkdir -p out
.venv/bin/spamnb train --index corpora/spamassassin.tar.xz --model out/model.joblib
.venv/bin/spamnb classify --model out/model.joblib corpora/sample-maildir
