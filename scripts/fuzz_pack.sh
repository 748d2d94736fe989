#!/usr/bin/env bash
# scripts/fuzz_pack.sh [OUT.tar.xz]: packs the libFuzzer targets of build-fuzz/ (./build.sh fuzz) for a
# machine without clang or the -dev packages (the device host: scripts/fuzz_parallel.sh runs them
# there), default build-fuzz/fuzzpack.tar.xz: the binaries without their DWARF (objcopy
# --strip-debug keeps the symbol table, so sanitizer reports still name functions; with DWARF the
# pack was several times the 20 MB it must stay under), the Debian .so files they link beyond libc
# (the device has no cJSON, PCRE2, libmicrohttpd or MPI packages), the corpora, engine-dummy's
# tokenizer and template (read by the server targets through DI_SOURCE_DIR), fuzz_target.sh and
# fuzz_parallel.sh, and the commit they were built from.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build-fuzz/fuzzpack.tar.xz}"
ls build-fuzz/fuzz_* >/dev/null 2>&1 || { echo "fuzz_pack: no targets in build-fuzz (./build.sh fuzz)" >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/fuzzpack/bin" "$stage/fuzzpack/lib" "$stage/fuzzpack/scripts" "$stage/fuzzpack/tests/data/models" "$stage/fuzzpack/fuzz"
for b in build-fuzz/fuzz_*; do
  [ -x "$b" ] && [ -f "$b" ] && objcopy --strip-debug "$b" "$stage/fuzzpack/bin/${b##*/}"
done
for lib in $(ldd build-fuzz/fuzz_* 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
             grep -v -E '/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/ld-linux|/libgcc_s|/libstdc|/libresolv'); do
  cp -L "$lib" "$stage/fuzzpack/lib/"
done
cp scripts/fuzz_target.sh scripts/fuzz_parallel.sh "$stage/fuzzpack/scripts/"
cp -r fuzz/corpus "$stage/fuzzpack/fuzz/"
cp -r tests/data/models/engine-dummy "$stage/fuzzpack/tests/data/models/"
git rev-parse --short HEAD >"$stage/fuzzpack/COMMIT" 2>/dev/null || echo unknown >"$stage/fuzzpack/COMMIT"
tar cf - -C "$stage" fuzzpack | xz -9 --lzma2=dict=192MiB >"$out"   # one stream: the binaries share most of their code
echo "fuzz_pack: $out ($(du -h "$out" | cut -f1); $(ls "$stage/fuzzpack/bin" | wc -l) targets, $(ls "$stage/fuzzpack/lib" | wc -l) libraries)"
