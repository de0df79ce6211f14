# Shared by scripts/demo.sh and scripts/test.sh: installs the Debian packages a build needs (only the
# missing ones), and picks the parallelism. Set EAGLE3_SKIP_APT=1 where dependencies come from elsewhere
# (the GPU host: see docs/gpu_host.md).

EAGLE3_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EAGLE3_JOBS=${EAGLE3_JOBS:-$(nproc)}

eagle3_install_packages() {
  [ "${EAGLE3_SKIP_APT:-0}" = 1 ] && return 0
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "==> installing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

EAGLE3_BUILD_PACKAGES=(cmake ninja-build g++ libabsl-dev libeigen3-dev nlohmann-json3-dev
                       libdlpack-dev libgtest-dev libgmock-dev libbenchmark-dev)
EAGLE3_CHECK_PACKAGES=(clang libclang-rt-14-dev)

eagle3_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}
