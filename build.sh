#!/usr/bin/env bash
# Build DeepInfer. Installs missing Debian packages first (needs root or sudo on a fresh machine).
#   ./build.sh            release build in build/
#   ./build.sh test       build, then run the whole test suite (ctest: C tests and pytest)
#   ./build.sh asan       AddressSanitizer + UBSan build in build-asan/ and its test run
#   ./build.sh fuzz       libFuzzer targets in build-fuzz/ (clang)
#   ./build.sh fuzz-run [SECONDS]  builds them, runs each for SECONDS (default 60) and merges its finds into fuzz/corpus/
# Environment: DI_CUDA=ON|OFF|AUTO (default AUTO: the CUDA backend is built when nvcc exists),
#   JOBS (parallel build jobs).
set -euo pipefail
cd "$(dirname "$0")"
MODE="${1:-build}"
JOBS="${JOBS:-$(nproc)}"

# Each step runs through `step NAME HINT CMD...`: on failure the script stops there and says which
# step failed and what to do, instead of going on to fail later with a message about something else.
step() {
  local name="$1" hint="$2"; shift 2
  echo "build.sh: $name" >&2
  if ! "$@"; then
    echo "build.sh: FAILED: $name" >&2
    echo "build.sh: $hint" >&2
    exit 1
  fi
}

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
if [ "$MODE" = fuzz ]; then have_cmd clang || need_pkgs+=(clang); fi
if [ "$MODE" = test ] && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then need_pkgs+=(python3-venv); fi
apt_install() {
  local SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends "$@"
}
if [ ${#need_pkgs[@]} -gt 0 ]; then
  step "installing Debian packages: ${need_pkgs[*]} (apt-get; about two minutes on a fresh machine)" \
    "apt-get could not install them: check the network and the apt sources, or install them by hand (as root: apt-get install ${need_pkgs[*]}), then run ./build.sh again" \
    apt_install "${need_pkgs[@]}"
fi
# nvcc lives outside PATH on some machines
if ! have_cmd nvcc && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

configure_and_build() {  # dir, extra cmake args...
  local dir="$1"; shift
  step "configuring $dir (cmake)" "cmake failed: its messages above name what is missing; DI_CUDA=OFF ./build.sh builds without the CUDA backend" \
    cmake -S . -B "$dir" -DDI_CUDA="${DI_CUDA:-AUTO}" "$@"
  step "building $dir" "the compiler's first error above is the cause; after fixing it run ./build.sh again (rm -rf $dir for a clean build)" \
    cmake --build "$dir" -j "$JOBS"
}

# A Python with the test requirements: this one if it has them, else a virtual environment in
# build/pyvenv (Debian's system Python has no pip and refuses system-wide pip installs; the venv gets
# pip from ensurepip, which python3-venv provides).
TEST_PYTHON=""
make_test_python() {
  local req=tests/python/requirements.txt
  if python3 -c 'import pytest, tokenizers, jsonschema, rfc3339_validator, transformers, openai, jinja2, pyarrow, matplotlib' >/dev/null 2>&1; then
    TEST_PYTHON="$(command -v python3)"; return 0
  fi
  local venv=build/pyvenv
  if [ ! -x "$venv/bin/python" ]; then mkdir -p build && python3 -m venv "$venv" || return 1; fi
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -r "$req" || return 1
  TEST_PYTHON="$PWD/$venv/bin/python"
}

case "$MODE" in
  build) configure_and_build build -DCMAKE_BUILD_TYPE=Release ;;
  test)
    step "installing the Python test requirements (tests/python/requirements.txt, from PyPI into build/pyvenv)" \
      "pip could not install them: check the network (PyPI must be reachable), or rm -rf build/pyvenv and run ./build.sh test again" \
      make_test_python
    configure_and_build build -DCMAKE_BUILD_TYPE=Release -DDI_PYTHON="$TEST_PYTHON"
    step "running the tests (ctest)" "the failing tests are listed above with their output; run one alone with: ctest --test-dir build -R NAME --output-on-failure" \
      ctest --test-dir build --output-on-failure -j "$JOBS" ;;
  asan)
    DI_CUDA=OFF configure_and_build build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DDI_SANITIZE=ON
    step "running the C tests under AddressSanitizer and UBSan (ctest)" "the sanitizer report above names the defect; run one test alone with: ctest --test-dir build-asan -R NAME --output-on-failure" \
      env ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$JOBS" -E python ;;
  fuzz)
    CC=clang DI_CUDA=OFF configure_and_build build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDI_FUZZ=ON \
      -DCMAKE_C_COMPILER=clang -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" ;;
  fuzz-run) "$0" fuzz && scripts/fuzz_run.sh "${2:-60}" ;;
  *) echo "usage: $0 [build|test|asan|fuzz|fuzz-run [SECONDS]]" >&2; exit 2 ;;
esac
