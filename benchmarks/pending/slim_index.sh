#!/bin/bash
# The device tool copies the tracked tree and the carry under one 64 MiB limit; the tree alone is
# 58 MiB, most of it records no call reads (benchmarks/runs, models). `on` takes them out of the
# index and hides them in .git/info/exclude so a call with staged binaries fits; `off` puts both
# back. Commit nothing while it is on: the commit would delete them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
paths=(${SLIM_PATHS:-benchmarks/runs models})
case "${1:-}" in
  on)
    git rm -r -q --cached --ignore-unmatch "${paths[@]}"
    for p in "${paths[@]}"; do grep -qxF "$p/" .git/info/exclude || echo "$p/" >> .git/info/exclude; done ;;
  off)
    for p in "${paths[@]}"; do sed -i "\\#^$p/\$#d" .git/info/exclude; done
    git reset -q -- "${paths[@]}" ;;
  *) echo "usage: $0 on|off" >&2; exit 2 ;;
esac
git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {printf "tracked: %.1f MiB\n", s / 1048576}'
