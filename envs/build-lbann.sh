#!/usr/bin/env bash
# Builds a CPU-only LBANN with LBANN's own CMake SuperBuild (scripts/superbuild)
# into one cached prefix, part by part: Clara, cereal, zstr, Hydrogen,
# DiHydrogen (with a checkout of Aluminum), Conduit (with a checkout of BLT),
# then LBANN. Debian's (or the cluster's) MPI, OpenBLAS/LAPACK, HDF5,
# protobuf, hwloc and spdlog are used as they are; ccache when installed.
#
# Each part is one SuperBuild target; a part that finished is stamped and
# skipped next time, and one that was cut off resumes inside its own build
# tree (the SuperBuild keeps ExternalProject stamps). Each part's time goes to
# $PREFIX/build-times.tsv; where the build stopped, with the error's last
# lines, to $PREFIX/status.txt; the versions to $PREFIX/versions.json.
#
# Sources are checked out at pinned commits and handed to the SuperBuild as
# LBANN_SB_<PKG>_SOURCE_DIR, so it never needs the network itself:
#   envs/build-lbann.sh                         clones from GitHub
#   DDLC_SOURCES=/path envs/build-lbann.sh      local git copies, /path/<owner>+<name>/repo
#   envs/build-lbann.sh --missing-packages      only lists the Debian packages it lacks here
# Variables: DDLC_LBANN_PREFIX (default ~/.cache/ddl-compare/lbann), JOBS (default 2),
#            LBANN_REF, HYDROGEN_REF, DIHYDROGEN_REF, CONDUIT_REF, CLARA_REF, CEREAL_REF, ZSTR_REF,
#            HDF5_DIR (the HDF5 Conduit uses; default Debian's serial one).
# Last, $PREFIX/venv: the environment the harness uses (found there, or set
# DDLC_VENV_LBANN); docs: envs/lbann.md.
set -euo pipefail

# shellcheck source=envs/build-lib.sh
. "$(dirname "$0")/build-lib.sh"

# Pinned in envs/sources.txt: LBANN develop of 2024-10-17 (the v0.105
# pre-release), whose SuperBuild this is, and the dependency commits of the
# same time that the SuperBuild names (Hydrogen's "hydrogen" branch,
# DiHydrogen's develop, Clara v1.1.5, cereal v1.3.0).
LBANN_REF=${LBANN_REF:-$(pin LLNL/lbann)}
HYDROGEN_REF=${HYDROGEN_REF:-$(pin LLNL/Elemental)}
DIHYDROGEN_REF=${DIHYDROGEN_REF:-$(pin LLNL/DiHydrogen)}
CLARA_REF=${CLARA_REF:-$(pin catchorg/Clara)}
CEREAL_REF=${CEREAL_REF:-$(pin USCiLab/cereal)}
ZSTR_REF=${ZSTR_REF:-$(pin mateidavid/zstr)}
# LBANN cannot be built without Conduit (its data readers include it whatever
# LBANN_WITH_CONDUIT says). v0.9.2 (2024-07) is the release of LBANN's time;
# its BLT submodule is checked out with it.
CONDUIT_REF=${CONDUIT_REF:-$(pin LLNL/conduit)}
HDF5_DIR=${HDF5_DIR:-/usr/lib/x86_64-linux-gnu/hdf5/serial}
# DiHydrogen fetches Aluminum itself (FetchContent) at this commit; it gets a
# checkout instead, as FETCHCONTENT_SOURCE_DIR_ALUMINUM.
ALUMINUM_REF=${ALUMINUM_REF:-$(pin LLNL/Aluminum)}
CACHE=$(ddlc_cache_root)
PREFIX=${DDLC_LBANN_PREFIX:-$CACHE/lbann}
JOBS=${JOBS:-2}
SRC=$PREFIX/src
BUILD=$PREFIX/superbuild
STAMPS=$PREFIX/stamps
mkdir -p "$SRC" "$STAMPS" "$BUILD"

# package name in the SuperBuild, GitHub repository, ref
PACKAGES=(
  "Clara catchorg/Clara $CLARA_REF"
  "cereal USCiLab/cereal $CEREAL_REF"
  "zstr mateidavid/zstr $ZSTR_REF"
  "Hydrogen LLNL/Elemental $HYDROGEN_REF"
  "DiHydrogen LLNL/DiHydrogen $DIHYDROGEN_REF"
  "Conduit LLNL/conduit $CONDUIT_REF"
  "LBANN LLNL/lbann $LBANN_REF"
)

log() { printf '[build-lbann %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# Each attempt's logs: a folder of their own, never written by another.
LOGS=$PREFIX.logs/$(date -u +%Y%m%dT%H%M%SZ)-$$

# part NAME COMMAND...: runs COMMAND unless NAME is stamped; times it, and on
# failure writes where it stopped to status.txt.
part() {
  local name=$1 t0 rc=0 log=$LOGS/$1.log; shift
  if [[ -e $STAMPS/$name ]]; then log "$name: already built ($(cat "$STAMPS/$name"))"; return; fi
  log "$name: start"
  t0=$(date +%s)
  mkdir -p "$LOGS"
  "$@" > "$log" 2>&1 || rc=$?
  local secs=$(( $(date +%s) - t0 ))
  printf '%s\t%s\t%s\t%s\n' "$name" "$secs" "$rc" "$(date -u +%FT%TZ)" >> "$PREFIX/build-times.tsv"
  if (( rc != 0 )); then
    { echo "stopped in part $name after ${secs}s (exit $rc) at $(date -u +%FT%TZ); log: $log"
      grep -n -m 5 -E 'error|Error|ERROR' "$log" || true
      echo '--- last lines ---'; tail -n 30 "$log"; } > "$PREFIX/status.txt"
    log "$name: FAILED after ${secs}s; see $PREFIX/status.txt"
    cat "$PREFIX/status.txt"
    exit "$rc"
  fi
  echo "${secs}s, $(date -u +%FT%TZ)" > "$STAMPS/$name"
  log "$name: done in ${secs}s"
}

configure_args() {
  local entry pkg repo ref
  for entry in "${PACKAGES[@]}"; do
    read -r pkg repo ref <<< "$entry"
    # With a source folder given, the SuperBuild clears its download options
    # but Clara's and zstr's ExternalProject_Add still append their URL and
    # tag after INSTALL_DIR, which then names a second folder beside the
    # prefix ("<prefix>;https;/github.com/...") in the shared cache: no URL, no tag.
    args+=("-DLBANN_SB_BUILD_$pkg=ON" "-DLBANN_SB_${pkg}_SOURCE_DIR=$SRC/$pkg"
           "-DLBANN_SB_${pkg}_URL=" "-DLBANN_SB_${pkg}_TAG=")
    command -v ccache >/dev/null && args+=("-DLBANN_SB_FWD_${pkg}_CMAKE_CXX_COMPILER_LAUNCHER=ccache")
  done
  args+=("-DLBANN_SB_FWD_DiHydrogen_FETCHCONTENT_SOURCE_DIR_ALUMINUM=$SRC/Aluminum"
         # its tests would fetch Catch2 from GitHub; a developer build adds -Werror
         "-DLBANN_SB_FWD_DiHydrogen_H2_ENABLE_TESTS=OFF"
         "-DLBANN_SB_FWD_DiHydrogen_H2_DEVELOPER_BUILD=OFF"
         # Debian's protobuf has no CMake config file: LBANN's FindProtobuf path
         "-DLBANN_SB_FWD_LBANN_LBANN_USE_PROTOBUF_MODULE=ON"
         # Conduit opts in to HDF5 only when HDF5_DIR is given
         "-DLBANN_SB_FWD_Conduit_HDF5_DIR=$HDF5_DIR"
         # said outright: a SuperBuild tree configured once without it keeps OFF
         "-DLBANN_SB_FWD_LBANN_LBANN_WITH_CONDUIT=ON"
         # the NumPy readers; our mnist and cifar10 readers do not need them.
         "-DLBANN_SB_FWD_LBANN_LBANN_WITH_CNPY=OFF"
         # TensorBoard summaries: unused here, and this commit's
         # summary_impl.hpp does not compile (reduce_scalar names an
         # undeclared 'mat': summary_impl.hpp:132)
         "-DLBANN_SB_FWD_LBANN_LBANN_WITH_TBINF=OFF")
}

configure() {
  cmake -S "$SRC/LBANN/scripts/superbuild" -B "$BUILD" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_C_COMPILER=mpicc -DCMAKE_CXX_COMPILER=mpicxx \
    -DLBANN_SB_FWD_Hydrogen_Hydrogen_ENABLE_OPENMP=ON \
    -DLBANN_SB_FWD_LBANN_LBANN_WITH_PYTHON_FRONTEND=ON \
    -DLBANN_SB_FWD_LBANN_LBANN_WITH_UNIT_TESTING=OFF \
    "${args[@]}"
}

# versions.json, flat as build-tarantella.sh writes it ("<part>": ref,
# "<part>_commit": commit); make_venv links it into the environment, where
# each run's rank record picks it up (frameworks/common.built_versions).
write_versions() {
  local entry pkg repo ref name json="{" commit
  for entry in "${PACKAGES[@]}" "Aluminum LLNL/Aluminum $ALUMINUM_REF"; do
    read -r pkg repo ref <<< "$entry"
    name=${pkg,,}
    commit=$(cat "$SRC/$pkg.commit" 2>/dev/null || echo unknown)
    json+="\"$name\": \"$ref\", \"${name}_commit\": \"$commit\", "
  done
  echo "$json\"hdf5_dir\": \"$HDF5_DIR\", \"built_by\": \"envs/build-lbann.sh\"}" > "$PREFIX/versions.json"
}

# The environment the harness runs LBANN's driver in (DDLC_VENV_LBANN):
# this Python with numpy and protobuf, LBANN's installed front end on its
# path, LBANN's executable in its bin/.
make_venv() {
  local front_end site
  # installed next to the lbann package (PYTHON_INSTALL_PREFIX/CMAKE_INSTALL_PYTHONDIR),
  # never the copies in the source and build trees
  front_end=$(find "$PREFIX"/lib* -name lbann_pb2.py -print -quit)
  [[ -n $front_end ]] || { echo "no lbann_pb2.py under $PREFIX: LBANN's front end was not installed" >&2; return 1; }
  python3 -m venv "$PREFIX/venv"
  # what the harness's worker imports (as in the other environments), and
  # a protobuf whose runtime reads what Debian's protoc 3.21 generated
  "$PREFIX/venv/bin/pip" install -q 'numpy==2.4.6' 'protobuf==4.25.3' 'pyyaml==6.0.3' \
    'psutil==7.2.2' 'otf2==3.2' 'nvidia-ml-py==13.615.71'
  site=$("$PREFIX/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  dirname "$front_end" > "$site/ddlc-lbann.pth"
  ln -sf "$PREFIX/bin/lbann" "$PREFIX/venv/bin/lbann"
  write_versions && ln -sf "$PREFIX/versions.json" "$PREFIX/venv/versions.json"
  "$PREFIX/venv/bin/python" -c 'import lbann; print("lbann front end:", lbann.__file__)'
}

# LBANN takes "Aluminum found" (here: installed by DiHydrogen, which always
# brings it) for "Hydrogen has Aluminum", and then calls Hydrogen's
# Aluminum-only GetComm. Hydrogen is built without it (the SuperBuild's
# default when it does not build Aluminum itself), so LBANN is told to use
# Aluminum only when Hydrogen has it: its plain MPI path otherwise.
patch_lbann_aluminum() {
  local cmake=$SRC/LBANN/CMakeLists.txt
  sed -i 's/^if (Aluminum_FOUND)$/if (Aluminum_FOUND AND _HYDROGEN_HAVE_ALUMINUM)/' "$cmake"
  grep -q '^if (Aluminum_FOUND AND _HYDROGEN_HAVE_ALUMINUM)$' "$cmake"
}

# LBANN adds -g to every compile, whatever the build type: debug information
# for its template-heavy layers costs compile time and gigabytes on 2 cores,
# for a build nobody debugs here.
patch_lbann_debug_info() {
  local flags=$SRC/LBANN/cmake/modules/SetupCXX.cmake
  sed -i 's/^  -g -Wall -Wextra/  -Wall -Wextra/' "$flags"
  ! grep -q '^  -g -Wall' "$flags"
}

# comm_nb_request.hpp names MPI_Request without including <mpi.h>; with
# Aluminum, Al.hpp brought it. Without, l2.hpp (which includes it first)
# does not compile: it includes <mpi.h> first now. Only l2.hpp is touched,
# so the objects built before this patch stay valid.
patch_lbann_mpi_request() {
  local header=$SRC/LBANN/include/lbann/objective_functions/weight_regularization/l2.hpp
  grep -q '^#include <mpi.h>$' "$header" && return
  sed -i 's|^#include "lbann/comm_nb_request.hpp"$|#include <mpi.h>\n#include "lbann/comm_nb_request.hpp"|' "$header"
  grep -q '^#include <mpi.h>$' "$header"
}

# K-FAC (an optimizer the harness does not use) calls Aluminum without the
# LBANN_HAS_ALUMINUM guard that the rest of LBANN has (::Al::MPIBackend in
# kfac_block.hpp, GetComm in kfac_block_gru.cpp): without Aluminum it is left
# out of the build and of the training-algorithm factory. Only sources not
# compiled yet are touched.
patch_lbann_without_kfac() {
  local algorithms=$SRC/LBANN/src/execution_algorithms
  if ! grep -q 'LBANN_HAS_ALUMINUM' "$algorithms/CMakeLists.txt"; then
    sed -i -e '/^  kfac\.cpp$/d' -e 's/^add_subdirectory(kfac)$/if (LBANN_HAS_ALUMINUM)\n  list(APPEND THIS_DIR_SOURCES "${CMAKE_CURRENT_SOURCE_DIR}\/kfac.cpp")\n  add_subdirectory(kfac)\nendif ()/' "$algorithms/CMakeLists.txt"
  fi
  if ! grep -q 'LBANN_HAS_ALUMINUM' "$algorithms/factory.cpp"; then
    sed -i -e 's|^#include "lbann/execution_algorithms/kfac.hpp"$|#ifdef LBANN_HAS_ALUMINUM\n#include "lbann/execution_algorithms/kfac.hpp"\n#endif|' \
      -e 's|^  fact.register_builder("KFAC", lbann::make<lbann::KFAC>);$|#ifdef LBANN_HAS_ALUMINUM\n  fact.register_builder("KFAC", lbann::make<lbann::KFAC>);\n#endif|' \
      "$algorithms/factory.cpp"
  fi
  grep -q 'if (LBANN_HAS_ALUMINUM)' "$algorithms/CMakeLists.txt" &&
    [[ $(grep -c 'LBANN_HAS_ALUMINUM' "$algorithms/factory.cpp") == 2 ]]
}

# LTFB (a training algorithm the harness does not use) asks Hydrogen for
# Collective::SEND and RECV communicators, which the Hydrogen built here does
# not name (it has SENDRECV). Without Aluminum, EnsureComm is a no-op for any
# collective, so SENDRECV there changes nothing that runs.
patch_lbann_ltfb_sendrecv() {
  local source=$SRC/LBANN/src/execution_algorithms/ltfb/truncation_selection_exchange.cpp
  sed -i -E 's/El::Collective::(SEND|RECV)>/El::Collective::SENDRECV>/' "$source"
  ! grep -Eq 'El::Collective::(SEND|RECV)>' "$source"
}

checkout_aluminum() {
  checkout LLNL/Aluminum "$ALUMINUM_REF" "$SRC/Aluminum" && submodules "$SRC/Aluminum"
}

checkout_blt() { submodules "$SRC/Conduit" src/blt; }

# The Debian packages the SuperBuild takes from the system.
LBANN_DEBIAN_PACKAGES=(libopenmpi-dev libopenblas-dev liblapack-dev libprotobuf-dev protobuf-compiler
                       libhwloc-dev libspdlog-dev libopencv-dev libhdf5-dev)

# What the SuperBuild takes from the system, every problem said at once
# before hours of work.
check_prerequisites() {
  local missing problems=0
  missing=$(missing_debian_packages "${LBANN_DEBIAN_PACKAGES[@]}")
  if [[ -n $missing ]]; then
    echo "build-lbann: missing Debian packages; run: apt-get install -y $missing" >&2
    problems=1
  fi
  if [[ ! -d $HDF5_DIR ]]; then
    echo "build-lbann: HDF5_DIR=$HDF5_DIR does not exist; set HDF5_DIR to the HDF5 Conduit should use" >&2
    problems=1
  fi
  (( problems == 0 )) || exit 2
}

# The sources of the parts not checked out yet, as REPO=REF.
sources_to_build() {
  local entry pkg repo ref
  for entry in "${PACKAGES[@]}"; do
    read -r pkg repo ref <<< "$entry"
    [[ -e $STAMPS/source-$pkg-$ref ]] || echo "$repo=$ref"
  done
  [[ -e $STAMPS/aluminum-source-2 ]] || echo "LLNL/Aluminum=$ALUMINUM_REF"
}

main() {
  check_prerequisites
  local needed
  mapfile -t needed < <(sources_to_build)
  check_sources lbann "${needed[@]}"
  # Other checkouts share the prefix, which cannot be moved once built (its
  # paths are compiled in): one builds while the others wait for it.
  lock_entry "$PREFIX"
  trap write_versions EXIT
  args=()
  configure_args
  # One part per source, named with its ref: a new ref is checked out again,
  # and a tree that was built is never touched (that would rebuild it).
  local entry pkg repo ref
  for entry in "${PACKAGES[@]}"; do
    read -r pkg repo ref <<< "$entry"
    part "source-$pkg-$ref" checkout "$repo" "$ref" "$SRC/$pkg"
  done
  part "patch-aluminum-$LBANN_REF" patch_lbann_aluminum
  part "patch-debug-info-$LBANN_REF" patch_lbann_debug_info
  part "patch-mpi-request-$LBANN_REF" patch_lbann_mpi_request
  part "patch-without-kfac-$LBANN_REF" patch_lbann_without_kfac
  part "patch-ltfb-sendrecv-$LBANN_REF" patch_lbann_ltfb_sendrecv
  part "aluminum-source-2" checkout_aluminum
  part conduit-blt-source checkout_blt
  # Re-run whenever the arguments change: their hash is in the part's name.
  part "configure-$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-12)" configure
  for entry in "${PACKAGES[@]}"; do
    read -r pkg _ <<< "$entry"
    part "$pkg" make -C "$BUILD" -j"$JOBS" "$pkg"
  done
  part venv make_venv
  rm -f "$PREFIX/status.txt"
  log "LBANN built into $PREFIX: export DDLC_VENV_LBANN=$PREFIX/venv"
}

# One line, read whole before it runs: editing this file during a build
# cannot change what the running build does next.
# --missing-packages: only list the Debian packages the build lacks here.
if [[ ${1:-} == --missing-packages ]]; then missing_debian_packages "${LBANN_DEBIAN_PACKAGES[@]}"; exit 0; fi
main "$@"; exit
