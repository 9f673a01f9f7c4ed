#!/usr/bin/env bash
# Builds GaspiCxx's own test suite (googletest, its CMake option
# ENABLE_TESTS) at the pinned tag, with one of our patches, in a folder of
# its own, and runs it (ctest: every test at 1 to 4 ranks on this machine,
# through gaspi_run; envs/local-ssh starts the ranks here without an ssh
# server). The suite's cleanup script and test, which kill processes by
# name machine-wide, are neutralised and left out. GPI-2 is taken from a Tarantella build's prefix.
#
# Usage: envs/check-gaspicxx-tests.sh ours|upstream|none DIR
#   ours      envs/patches/tarantella/GaspiCxx.json (what the patched build uses)
#   upstream  envs/patches/tarantella/upstream/GaspiCxx-sweep-pause.diff (the
#             form to send upstream: the state in the progress engine)
#   none      GaspiCxx as released (the reference)
#   DIR       a private folder for the source, build and logs (made anew)
# Variables: DDLC_SOURCES (local git copies, as envs/build-tarantella.sh),
#   DDLC_TARANTELLA_PREFIX (the prefix whose GPI-2 to use), JOBS (default 2),
#   CTEST_ARGS (e.g. "-R Allreduce").
# Needs Debian's libgtest-dev. Last line: passed=N failed=M variant=V.
set -euo pipefail
# shellcheck source=envs/build-lib.sh
. "$(dirname "$0")/build-lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
variant=${1:-}; dir=${2:-}
if [[ ! $variant =~ ^(ours|upstream|none)$ || -z $dir ]]; then
  echo "usage: $0 ours|upstream|none DIR" >&2; exit 2
fi
[[ -e /usr/include/gtest/gtest.h ]] || {
  echo "check-gaspicxx-tests: googletest missing: apt-get install libgtest-dev" >&2; exit 2; }
prefix=${DDLC_TARANTELLA_PREFIX:-$(ddlc_cache_root)/tarantella-$(pin cc-hpc-itwm/tarantella)}
[[ -x $prefix/bin/gaspi_run ]] || {
  echo "check-gaspicxx-tests: no GPI-2 in $prefix: run 'bash envs/build-tarantella.sh' first" >&2; exit 2; }
src=$dir/GaspiCxx
checkout cc-hpc-itwm/GaspiCxx "$(pin cc-hpc-itwm/GaspiCxx)" "$src"
# The suite's run_test.cmake runs cmake/cleanup.sh through gaspi_run after
# EVERY test (not only in the cleanup test left out below), and that script
# kills every process on the machine whose command line matches "test" (any
# pytest, this script itself). Neutralised before anything is configured; a
# -DCLEANUP_SCRIPT would not help (test_helpers.cmake sets it itself).
printf '#!/bin/sh\n# neutralised by check-gaspicxx-tests.sh: upstream kills by name\nexit 0\n' \
  > "$src/cmake/cleanup.sh"
case $variant in
  ours) python3 "$here/patches/apply.py" "$here/patches/tarantella/GaspiCxx.json" "$src" ;;
  upstream) git -C "$src" apply "$here/patches/tarantella/upstream/GaspiCxx-sweep-pause.diff" ;;
esac
# The tests' scripts keep the PATH (and LD_LIBRARY_PATH) they were configured
# with. No LD_LIBRARY_PATH: it would come before the tests' RUNPATH and load
# the prefix's GaspiCxx instead of the one built here.
export PATH=$here/local-ssh:$prefix/bin:$PATH
unset LD_LIBRARY_PATH
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The prefix's GPI-2 has no debug library, which FindGPI2 requires and only a
# Debug build links (envs/build-tarantella.sh): the library stands in for it.
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DENABLE_TESTS=ON -DBUILD_PYTHON_BINDINGS=OFF -DBUILD_SHARED_LIBS=ON "${launcher[@]}" \
  -DGPI2_DBG_LIBRARY="$prefix/lib64/libGPI2.so" \
  -DCMAKE_CXX_FLAGS=-Wno-error "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG -Wno-error" > "$dir/cmake.log"
cmake --build "$src/build" -j"${JOBS:-2}" > "$dir/build.log"
grep -qx 'exit 0' "$src/cmake/cleanup.sh" || {
  echo "check-gaspicxx-tests: $src/cmake/cleanup.sh is live (it kills by name); not running ctest" >&2; exit 2; }
# GPI-2 listens on fixed ports: one job a machine at a time (the lock
# Tarantella's runs take). The suite's last test, gpi_cleanup_4ranks, kills
# processes by name (gaspi_cleanup's killall): left out, also as a fixture (-FC).
# shellcheck disable=SC2086
(cd "$src/build" && flock /tmp/ddlc-gpi2.lock ctest --output-on-failure -E cleanup -FC '.*' ${CTEST_ARGS:-}) \
  > "$dir/ctest.log" 2>&1 || true
tail -n 15 "$dir/ctest.log"
passed=$(grep -c ' Passed ' "$dir/ctest.log" || true)
failed=$(grep -cE '\*\*\*(Failed|Timeout|Exception)|Failed  ' "$dir/ctest.log" || true)
echo "passed=$passed failed=$failed variant=$variant"
