#!/usr/bin/env bash
# Trains the tiny DeepSeek-V2 code model and its EAGLE-3 draft into OUT_DIR (see train.py).
#   tools/train_tiny/train.sh OUT_DIR [--seed 0] [--device cuda|cpu] [--budget-seconds N] [more: --help]
# PYTHON selects the interpreter (default python3); its stdlib and site-packages are the corpus.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* && "$1" != "--help" && "$1" != "-h" ]]; then
  echo "usage: $0 OUT_DIR [--seed 0] [--device cuda|cpu] [--budget-seconds N]" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONHASHSEED=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
exec "${PYTHON:-python3}" "$here/train.py" "$@"
