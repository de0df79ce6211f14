#!/usr/bin/env bash
# Trains only the MLA EAGLE-3 draft against an already-trained target (see train_mla_draft.py).
#   tools/train_tiny/train_mla_draft.sh OUT_DIR --target models/tiny-v2-code [--device cuda|cpu]
#       [--budget-seconds N] [--seed 0] [more: --help]
# PYTHON selects the interpreter (default python3); its stdlib and site-packages are the corpus.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* && "$1" != "--help" && "$1" != "-h" ]]; then
  echo "usage: $0 OUT_DIR --target DIR [--device cuda|cpu] [--budget-seconds N] [--seed 0]" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
exec "${PYTHON:-python3}" "$here/train_mla_draft.py" "$@"
