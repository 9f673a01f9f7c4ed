#!/usr/bin/env bash
# Builds Tarantella for CPUs (Ethernet/TCP) into one cached prefix, which is
# also the Python environment the harness runs it in (DDLC_VENV_TARANTELLA):
#   Python 3.9 -> venv + TensorFlow -> GPI-2 -> GaspiCxx (+ pygpi) -> Tarantella
# Each part is stamped when it has finished, so a second run skips what is
# built and a run that was cut off resumes at the part it was in. Each part's
# time goes to $PREFIX/build-times.tsv, the versions to $PREFIX/versions.json
# (run.json copies it).
#
# Pinned (envs/sources.txt): Tarantella v0.8.0 (its latest tag), the GPI-2
# and GaspiCxx tags its installation guide names; here, the TensorFlow its
# documentation supports (2.0-2.7; TF 2.7 wheels exist for Python 3.7-3.9).
#
# Other checkouts share the prefix. It is a Python environment, which cannot
# be built elsewhere and renamed into place (its scripts and pyvenv.cfg hold
# its absolute path): instead the whole build holds a lock on the prefix
# (flock on PREFIX.lock), so one checkout builds while another waits, saying
# for whom, and then finds every part stamped. A part's stamp is written only
# when the part has finished, so a build that was cut off resumes at the part
# it was in; a file where the prefix belongs is removed first.
# Before anything is built, the sources of the parts still to build are
# checked (envs/build-lib.sh: check_sources); without them it stops at once.
#
# Usage: envs/build-tarantella.sh            clones from the public repositories
#        envs/build-tarantella.sh patched    the same with our patch to GaspiCxx
#            (envs/patches/tarantella: its progress thread sleeps while no
#            collective runs; docs/improvements.md) in a prefix of its own,
#            ~/.cache/ddl-compare/tarantella-v0.8.0-patched (the framework
#            level tarantella-patched; DDLC_VENV_TARANTELLA_PATCHED)
#        DDLC_SOURCES=/path envs/build-tarantella.sh
#            takes local git copies instead: /path/<owner>+<name>/repo (or
#            /path/<owner>+<name>), e.g. /path/cc-hpc-itwm+GPI-2/repo, as
#            `./ddlc sources /path` gathers them
#        envs/build-tarantella.sh [patched] --check-sources
#            only checks, in seconds, that the sources still needed can be had
# Variables: DDLC_TARANTELLA_PREFIX (default ~/.cache/ddl-compare/tarantella-v0.8.0),
#            DDLC_PYTHON39 (a python3.9 to use; else found on PATH or pyenv, else
#            built from CPython's sources), JOBS (default 2), GPI2_CONFIGURE_EXTRA
#            (e.g. --with-slurm on Slurm clusters; --with-infiniband instead of Ethernet).
# How long, part by part: envs/tarantella.md.
set -euo pipefail

# shellcheck source=envs/build-lib.sh
. "$(dirname "$0")/build-lib.sh"

TNT_REF=${TNT_REF:-$(pin cc-hpc-itwm/tarantella)}
GPI2_REF=${GPI2_REF:-$(pin cc-hpc-itwm/GPI-2)}
GASPICXX_REF=${GASPICXX_REF:-$(pin cc-hpc-itwm/GaspiCxx)}
CPYTHON_REF=${CPYTHON_REF:-$(pin python/cpython)}
TF_SPEC=${TF_SPEC:-tensorflow-cpu==2.7.4}
# TF 2.7 breaks with protobuf >= 3.20 ("Descriptors cannot be created directly");
# pygpi uses np.float / np.int, removed in numpy 1.24.
# The rest: what the harness's worker imports (as envs/tensorflow.txt).
PY_DEPS=("$TF_SPEC" 'protobuf==3.19.6' 'numpy==1.21.6' 'pybind11==2.10.4' 'pyyaml==6.0.1'
         'psutil==5.9.8' 'otf2==3.2' 'nvidia-ml-py==13.615.71')
CACHE=$(ddlc_cache_root)
here=$(cd "$(dirname "$0")" && pwd)
# --check-sources: only check that the sources of the parts still to build
# can be had (./ddlc run does, before a fresh clone's long set-up).
CHECK_ONLY=
if [[ ${*: -1} == --check-sources ]]; then CHECK_ONLY=1; set -- "${@:1:$# - 1}"; fi
VARIANT=${1:-}
case $VARIANT in
  "") PATCH_SPEC= ; PREFIX=${DDLC_TARANTELLA_PREFIX:-$CACHE/tarantella-$TNT_REF} ;;
  patched)
    PATCH_SPEC=$here/patches/tarantella/GaspiCxx.json
    PREFIX=${DDLC_TARANTELLA_PATCHED_PREFIX:-$CACHE/tarantella-$TNT_REF-patched} ;;
  *) echo "build-tarantella: '$VARIANT': the only variant is 'patched'" >&2; exit 2 ;;
esac
# A change to our patch rebuilds GaspiCxx and Tarantella (its hash is in their parts' names).
PATCH_ID=
[[ -n $PATCH_SPEC ]] && PATCH_ID=-patch-$(cat "$PATCH_SPEC" "$here"/patches/tarantella/GaspiCxx/* | sha256sum | cut -c1-12)
JOBS=${JOBS:-2}
SRC=$PREFIX/src
STAMPS=$PREFIX/stamps
export PATH=$PREFIX/bin:$PATH
export LD_LIBRARY_PATH=$PREFIX/lib:$PREFIX/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# Both upstream projects build with -Werror; a newer GCC than theirs warns more.
NO_WERROR=(-DCMAKE_CXX_FLAGS=-Wno-error "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG -Wno-error")

# gaspi_run needs gawk (mawk fails with "Not enough hosts"); GPI-2's build, autotools.
check_tools() {
  local missing=() tool
  for tool in git gawk autoconf automake libtoolize cmake g++ make; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if (( ${#missing[@]} )); then
    echo "build-tarantella: missing ${missing[*]}; on Debian: apt-get install git gawk autoconf automake libtool cmake g++ make" >&2
    exit 2
  fi
}

log() { printf '[build-tarantella %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# part NAME FUNCTION: runs FUNCTION unless NAME is stamped; times it. The
# first part it builds says so at the terminal, once (main says when it is done).
BUILT_FROM= BUILD_START=
part() {
  local name=$1 fn=$2 t0
  if [[ -e $STAMPS/$name ]]; then log "$name: already built ($(cat "$STAMPS/$name"))"; return; fi
  if [[ -z $BUILT_FROM ]]; then
    BUILT_FROM=$name BUILD_START=$SECONDS
    notice "build-tarantella: building $PREFIX from its part '$name' on (how long: envs/tarantella.md)"
  fi
  log "$name: start"
  t0=$(date +%s)
  "$fn"
  local secs=$(( $(date +%s) - t0 ))
  printf '%s\t%s\t%s\n' "$name" "$secs" "$(date -u +%FT%TZ)" >> "$PREFIX/build-times.tsv"
  echo "${secs}s, $(date -u +%FT%TZ)" > "$STAMPS/$name"
  log "$name: done in ${secs}s"
}

find_python39() {
  local candidate
  for candidate in "${DDLC_PYTHON39:-}" "$(command -v python3.9 || true)" \
                   "$HOME"/.pyenv/versions/3.9*/bin/python3.9 "$CACHE/python-3.9/bin/python3.9"; do
    [[ -n $candidate && -x $candidate ]] && "$candidate" -c 'import ssl, venv' 2>/dev/null && { echo "$candidate"; return; }
  done
}

build_python() {
  [[ -n $(find_python39) ]] && return
  checkout python/cpython "$CPYTHON_REF" "$SRC/cpython"
  (cd "$SRC/cpython" && ./configure -q --prefix="$CACHE/python-3.9" --with-ensurepip=install \
     && make -s -j"$JOBS" && make -s install)
}

build_venv() {
  local py; py=$(find_python39)
  "$py" -m venv "$PREFIX"
  "$PREFIX/bin/pip" install -q --upgrade 'pip<24' 'setuptools<70' wheel
}

install_deps() {
  "$PREFIX/bin/pip" install -q "${PY_DEPS[@]}"
}

# Only the library Tarantella links (and gaspi_run): GPI-2's debug and
# statistics libraries (each all of its sources again, at -O0), the 147
# tests built with the debug one, the static copies (libtool compiles every
# source twice for them) and the Fortran modules are left out; the part took
# 59 s of CPU with them (envs/tarantella.md).
GPI2_ONLY_LIBRARY=(--disable-debug-lib --disable-stat-lib --disable-static --without-fortran)
# GaspiCxx's and Tarantella's FindGPI2 require the debug library, which they
# link only in a Debug build: this Release build names the library instead.
GPI2_LIBRARY=(-DGPI2_DBG_LIBRARY="$PREFIX/lib64/libGPI2.so")

build_gpi2() {
  checkout cc-hpc-itwm/GPI-2 "$GPI2_REF" "$SRC/GPI-2"
  # shellcheck disable=SC2086
  (cd "$SRC/GPI-2" && ./autogen.sh \
     && CFLAGS="-fPIC -fcommon" CPPFLAGS=-fPIC ./configure --with-ethernet "${GPI2_ONLY_LIBRARY[@]}" \
          ${GPI2_CONFIGURE_EXTRA:-} --prefix="$PREFIX" \
     && make -j"$JOBS" && make install)
}

cmake_build() {  # cmake_build SOURCE_DIR extra cmake args...
  local src=$1; shift
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DPython_EXECUTABLE="$PREFIX/bin/python" \
    -DPYTHON_EXECUTABLE="$PREFIX/bin/python" \
    -Dpybind11_DIR="$("$PREFIX/bin/python" -m pybind11 --cmakedir)" "${launcher[@]}" "${NO_WERROR[@]}" \
    "${GPI2_LIBRARY[@]}" "$@"
  cmake --build "$src/build" -j"$JOBS"
  cmake --install "$src/build"
}

build_gaspicxx() {
  checkout cc-hpc-itwm/GaspiCxx "$GASPICXX_REF" "$SRC/GaspiCxx"
  if [[ -n $PATCH_SPEC ]]; then
    python3 "$here/patches/apply.py" "$PATCH_SPEC" "$SRC/GaspiCxx"
  fi
  # Without the Python bindings `import tarantella` fails at `import pygpi`.
  cmake_build "$SRC/GaspiCxx" -DBUILD_SHARED_LIBS=ON -DBUILD_PYTHON_BINDINGS=ON
}

build_tarantella() {
  checkout cc-hpc-itwm/tarantella "$TNT_REF" "$SRC/tarantella"
  cmake_build "$SRC/tarantella"
}

write_versions() {
  "$PREFIX/bin/python" - "$PREFIX" "$TNT_REF" "$GPI2_REF" "$GASPICXX_REF" <<'EOF'
import json, pathlib, platform, sys
import tensorflow as tf
prefix, tnt, gpi2, gaspicxx = sys.argv[1:]
commit = lambda name: (pathlib.Path(prefix, "src", name + ".commit").read_text().strip()
                       if pathlib.Path(prefix, "src", name + ".commit").exists() else None)
patch = pathlib.Path(prefix, "patch.txt")
versions = {"tarantella": tnt, "tarantella_commit": commit("tarantella"),
            "gpi2": gpi2, "gpi2_commit": commit("GPI-2"),
            "gaspicxx": gaspicxx, "gaspicxx_commit": commit("GaspiCxx"),
            "tensorflow": tf.__version__, "python": platform.python_version(),
            "built_by": "envs/build-tarantella.sh",
            "patch": patch.read_text().strip() if patch.exists() else None}
pathlib.Path(prefix, "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
print(json.dumps(versions))
EOF
}

# Tarantella installs its Python packages under lib/tarantella/python and
# GaspiCxx its pygpi under lib; its launcher adds them to the ranks' paths.
# A .pth file makes them visible to this environment's python too (the
# harness's pre-flight check looks for the tarantella module there).
add_paths() {
  local site
  site=$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$PREFIX/lib/tarantella/python" "$PREFIX/lib/tarantella" "$PREFIX/lib" \
    > "$site/ddlc-tarantella.pth"
}

# Two ranks on this node sum a vector with Tarantella's all-reducer, over
# GPI-2 (TCP). gaspi_run starts ranks with ssh, this node's too: envs/local-ssh
# runs those here.
check() {
  local script; script=$(mktemp --suffix=.py)
  cat > "$script" <<'PY'
import numpy as np
import tarantella as tnt
total = tnt.TensorAllreducer(np.zeros(2)).allreduce(np.full(2, tnt.get_rank() + 1.0))
assert tnt.get_size() == 2 and list(total) == [3.0, 3.0], total
print(f"rank {tnt.get_rank()}: all-reduce ok")
PY
  (cd "$(dirname "$script")" && PATH=$here/local-ssh:$PATH \
     "$PREFIX/bin/tarantella" -n 2 --no-gpu -- "$(basename "$script")")
  rm -f "$script"
}

# The sources of the parts not built yet: checked before anything is built.
sources_to_build() {
  [[ -n $(find_python39) || -e $STAMPS/python ]] || echo "python/cpython=$CPYTHON_REF"
  [[ -e $STAMPS/gpi2 ]] || echo "cc-hpc-itwm/GPI-2=$GPI2_REF"
  [[ -e $STAMPS/gaspicxx$PATCH_ID ]] || echo "cc-hpc-itwm/GaspiCxx=$GASPICXX_REF"
  [[ -e $STAMPS/tarantella$PATCH_ID ]] || echo "cc-hpc-itwm/tarantella=$TNT_REF"
}

main() {
  local needed
  [[ -n $CHECK_ONLY ]] || check_tools
  mapfile -t needed < <(sources_to_build)
  check_sources "tarantella${VARIANT:+-$VARIANT}" "${needed[@]}"
  [[ -z $CHECK_ONLY ]] || exit 0
  lock_entry "$PREFIX"
  if [[ -e $PREFIX && ! -d $PREFIX ]] || [[ -L $PREFIX ]]; then
    notice "build-tarantella: $PREFIX is not a folder: removed, building it again"
    rm -f "$PREFIX"
  fi
  mkdir -p "$SRC" "$STAMPS"
  part python build_python
  part venv build_venv
  # Re-run whenever the list changes: its hash is in the part's name.
  part "python-deps-$(printf '%s\n' "${PY_DEPS[@]}" | sha256sum | cut -c1-12)" install_deps
  part gpi2 build_gpi2
  # Every time, not a part: a GPI-2 built again must not lose it (seconds).
  python3 "$here/patches/apply.py" "$here/patches/tarantella/gaspi-cleanup.json" "$PREFIX"
  if [[ -n $PATCH_SPEC ]]; then
    echo "envs/patches/tarantella/GaspiCxx.json ${PATCH_ID#-patch-}" > "$PREFIX/patch.txt"
  fi
  part "gaspicxx$PATCH_ID" build_gaspicxx
  part "tarantella$PATCH_ID" build_tarantella
  part paths add_paths
  write_versions
  part check check
  unlock_entry "$PREFIX"
  [[ -z $BUILT_FROM ]] || notice "build-tarantella: $PREFIX built in $(duration $((SECONDS - BUILD_START)))"
  log "ready: export DDLC_VENV_TARANTELLA${VARIANT:+_PATCHED}=$PREFIX"
}

# One line, read whole before it runs: editing this file during a build
# cannot change what the running build does next.
main "$@"; exit
