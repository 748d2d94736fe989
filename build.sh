#!/usr/bin/env bash
# Build DeepInfer. Installs missing Debian packages first (needs root or sudo on a fresh machine).
#   ./build.sh            release build in build/
#   ./build.sh test       build, then run the whole test suite (ctest: C tests and pytest)
#   ./build.sh asan       AddressSanitizer + UBSan build in build-asan/ and its test run
#   ./build.sh fuzz       libFuzzer targets in build-fuzz/ (clang)
# Environment: DI_CUDA=ON|OFF|AUTO (default AUTO: the CUDA backend is built when nvcc exists),
#   JOBS (parallel build jobs).
set -euo pipefail
cd "$(dirname "$0")"
MODE="${1:-build}"
JOBS="${JOBS:-$(nproc)}"

need_pkgs=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
have_cmd cmake || need_pkgs+=(cmake)
have_cmd cc || need_pkgs+=(gcc)
have_cmd c++ || need_pkgs+=(g++)
have_cmd make || need_pkgs+=(make)
have_cmd python3 || need_pkgs+=(python3)
have_cmd xz || need_pkgs+=(xz-utils)
have_pkg libcjson-dev || need_pkgs+=(libcjson-dev)
have_pkg libpcre2-dev || need_pkgs+=(libpcre2-dev)
have_pkg libmicrohttpd-dev || need_pkgs+=(libmicrohttpd-dev)
if [ "$MODE" = fuzz ]; then have_cmd clang || need_pkgs+=(clang); fi
if [ "$MODE" = test ] && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then need_pkgs+=(python3-venv); fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "build.sh: installing ${need_pkgs[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
# nvcc lives outside PATH on some machines
if ! have_cmd nvcc && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

configure_and_build() {  # dir, extra cmake args...
  local dir="$1"; shift
  cmake -S . -B "$dir" -DDI_CUDA="${DI_CUDA:-AUTO}" "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

# A Python with the test requirements: this one if it has them, else a virtual environment in
# build/pyvenv (Debian's system Python refuses pip installs).
test_python() {
  local req=tests/python/requirements.txt
  if python3 -c 'import pytest, tokenizers, jsonschema, rfc3339_validator, transformers, openai, jinja2' >/dev/null 2>&1; then
    command -v python3; return
  fi
  local venv=build/pyvenv
  if [ ! -x "$venv/bin/python" ]; then mkdir -p build && python3 -m venv "$venv" >&2; fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
  echo "$PWD/$venv/bin/python"
}

case "$MODE" in
  build) configure_and_build build -DCMAKE_BUILD_TYPE=Release ;;
  test)
    configure_and_build build -DCMAKE_BUILD_TYPE=Release -DDI_PYTHON="$(test_python)"
    ctest --test-dir build --output-on-failure -j "$JOBS" ;;
  asan)
    DI_CUDA=OFF configure_and_build build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DDI_SANITIZE=ON
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E python ;;
  fuzz)
    CC=clang DI_CUDA=OFF configure_and_build build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDI_FUZZ=ON \
      -DCMAKE_C_COMPILER=clang -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" ;;
  *) echo "usage: $0 [build|test|asan|fuzz]" >&2; exit 2 ;;
esac
