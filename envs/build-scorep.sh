#!/usr/bin/env bash
# Build Score-P (shared libraries, Open MPI, pthread support) into a cached
# prefix, then `pip install scorep` (the Python bindings) into .venv and
# .venv-tf. For `tracer: scorep` (docs/tracing.md, envs/scorep.md).
#
#   envs/build-scorep.sh                       # official release tarball, checksum checked
#                                              # (from $DDLC_SOURCES when set: ./ddlc sources)
#   envs/build-scorep.sh --source DIR          # an unpacked source folder
#   envs/build-scorep.sh --source GITDIR@REF   # a git dir holding the unpacked release
#                                              # (e.g. a copy of the msmania/Score-P mirror @v8.4)
#   SCOREP_SOURCE=... envs/build-scorep.sh     # the same as --source
#
# Resumable: each step (unpack, configure, make, install, bindings) leaves a
# stamp in the build folder and is skipped when its stamp is there; a failed
# step runs again on the next call. Each step prints its time. The installed
# version is written to <prefix>/ddlc-scorep.json (read into run.json).
# Checkouts share the prefix, which cannot be moved once built (its scripts
# hold its path): the build holds a lock on it (flock on <prefix>.lock), so a
# second one waits, saying for whom; each attempt's logs go to
# <prefix>.logs/<time>-<pid>/.
# Debian packages it needs: binutils-dev libunwind-dev libiberty-dev gfortran
# (and libopenmpi-dev, from envs/setup.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=envs/build-lib.sh
. "$(dirname "$0")/build-lib.sh"
version=8.4
# The tarball, its checksum and URL: envs/sources.txt.
tarball_name=scorep-$version.tar.gz
read -r _ _ _ tarball_sha256 tarball_url < <(pinned_sources scorep | awk -v f="$tarball_name" '$3 == f')
bindings_version=4.5.1
cache=$(ddlc_cache_root)
prefix=${SCOREP_PREFIX:-$cache/scorep-$version}
build=$cache/scorep-$version-build
source=${SCOREP_SOURCE:-}
jobs=${SCOREP_JOBS:-$(nproc)}
# --enable-shared: the Python bindings link Score-P's shared libraries; a
# default (static) build makes `pip install scorep` useless.
configure_flags=(--with-mpi=openmpi --without-shmem --disable-cuda --with-libbfd --with-libunwind
                 --enable-shared --disable-static)
# Extra flags for a cluster (e.g. --enable-cuda --with-libcudart=...), word-split on purpose.
read -r -a extra_flags <<< "${SCOREP_CONFIGURE_EXTRA:-}"

say() { printf 'build-scorep: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --source) source=${2:?--source needs a folder or GITDIR@REF}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a folder}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
mkdir -p "$build"
logs=$prefix.logs/$(date -u +%Y%m%dT%H%M%SZ)-$$
stamp() { echo "$build/.$1.done"; }

# Runs step NAME (a shell function) unless its stamp exists, and prints its time.
step() {
  local name=$1 start
  if [ -f "$(stamp "$name")" ]; then say "$name: done before, skipped"; return 0; fi
  say "$name: starting"
  start=$(date +%s)
  "step_$name"
  touch "$(stamp "$name")"
  say "$name: $(( $(date +%s) - start )) s"
}

check_packages() {
  local missing
  missing=$(missing_debian_packages binutils-dev libunwind-dev libiberty-dev gfortran)
  [ -z "$missing" ] || die "missing Debian packages; run: sudo apt-get install -y $missing"
  command -v mpicc >/dev/null || die "mpicc not on PATH: Score-P is built against the MPI Horovod uses (module load openmpi, or apt-get install libopenmpi-dev)"
}

# A git dir holding the unpacked release (as the msmania/Score-P mirror does).
# Some of its blobs may be missing from a partial copy (example .cube files):
# they are left out of the archive and created empty; the build does not read them.
unpack_git() {
  local gitdir=${1%@*} ref=${1##*@} listing missing
  [ "$gitdir" != "$1" ] || ref=HEAD
  listing=$(git --git-dir="$gitdir" ls-tree -r "$ref") || die "$gitdir has no $ref"
  missing=$(paste <(cut -f1 <<< "$listing" | awk '{print $3}' | git --git-dir="$gitdir" cat-file --batch-check) \
                  <(cut -f2 <<< "$listing") | awk -F'\t' '$1 ~ / missing$/ {print $2}')
  local excludes=()
  while IFS= read -r path; do [ -n "$path" ] && excludes+=(":(exclude)$path"); done <<< "$missing"
  git --git-dir="$gitdir" archive --format=tar "$ref" -- . "${excludes[@]}" | tar -x -C "$build/src"
  while IFS= read -r path; do
    [ -n "$path" ] || continue
    say "blob missing in $gitdir, created empty: $path"
    mkdir -p "$build/src/$(dirname "$path")"; : > "$build/src/$path"
  done <<< "$missing"
}

step_unpack() {
  rm -rf "$build/src"; mkdir -p "$build/src"
  if [ -z "$source" ]; then
    local tarball=$cache/$tarball_name
    [ -f "$tarball" ] || [ -z "${DDLC_SOURCES:-}" ] || tarball=$DDLC_SOURCES/$tarball_name
    if [ ! -f "$tarball" ]; then
      curl -fL --retry 3 -o "$tarball.part" "$tarball_url" ||
        die "could not download $tarball_url; pass --source with a local copy"
      mv "$tarball.part" "$tarball"
    fi
    echo "$tarball_sha256  $tarball" | sha256sum -c --quiet - ||
      { rm -f "$tarball"; die "checksum mismatch for $tarball (removed; run again)"; }
    tar -xzf "$tarball" -C "$build/src" --strip-components=1
  elif [ -f "$source/configure" ]; then
    cp -a "$source/." "$build/src/"
  elif git --git-dir="${source%@*}" rev-parse --git-dir >/dev/null 2>&1; then
    unpack_git "$source"
  else
    die "--source $source is neither a Score-P source folder (with configure) nor a git dir"
  fi
  [ -x "$build/src/configure" ] || die "no configure script in the unpacked source"
  echo "${source:-$tarball_url}" > "$build/source"
}

step_configure() {
  rm -rf "$build/obj"; mkdir -p "$build/obj"
  (cd "$build/obj" && "$build/src/configure" --prefix="$prefix" "${configure_flags[@]}" "${extra_flags[@]}") \
    > "$logs/configure.log" 2>&1 || { tail -n 30 "$logs/configure.log" >&2; die "configure failed; log: $logs/configure.log"; }
}

step_make() {
  make -C "$build/obj" -j"$jobs" > "$logs/make.log" 2>&1 ||
    { tail -n 30 "$logs/make.log" >&2; die "make failed; log: $logs/make.log (run again to resume)"; }
}

step_install() {
  make -C "$build/obj" install > "$logs/install.log" 2>&1 ||
    { tail -n 30 "$logs/install.log" >&2; die "make install failed; log: $logs/install.log"; }
  local reported
  reported=$("$prefix/bin/scorep" --version | awk '{print $NF}')
  printf '{"scorep": "%s", "prefix": "%s", "source": "%s", "configure": "%s"}\n' \
    "$reported" "$prefix" "$(cat "$build/source")" "${configure_flags[*]} ${extra_flags[*]}" > "$prefix/ddlc-scorep.json"
}

# The bindings build against scorep-config on PATH. They need setuptools >= 68,
# and pip would take the newest, which has no pkg_resources (gone in 81); the
# TensorFlow env's TensorBoard imports it: where it is there, it stays.
install_bindings() {
  local env=$1 constraints=$build/constraints-$(basename "$1").txt had_pkg_resources=no
  [ -x "$env/bin/python" ] || { say "no environment at $env, bindings skipped there"; return 0; }
  : > "$constraints"
  if "$env/bin/python" -c 'import pkg_resources' 2>/dev/null; then
    had_pkg_resources=yes
    echo 'setuptools<81' > "$constraints"
  fi
  PATH=$prefix/bin:$PATH "$env/bin/python" -m pip install -q "scorep==$bindings_version" -c "$constraints" \
    > "$logs/pip-$(basename "$env").log" 2>&1 ||
    { tail -n 30 "$logs/pip-$(basename "$env").log" >&2; die "pip install scorep failed in $env"; }
  PATH=$prefix/bin:$PATH "$env/bin/python" -c 'import scorep.user' || die "scorep bindings do not import in $env"
  [ $had_pkg_resources = no ] || "$env/bin/python" -c 'import pkg_resources' 2>/dev/null ||
    die "pkg_resources is gone from $env after pip install scorep"
  say "bindings scorep $bindings_version in $env"
}

step_bindings() {
  install_bindings "${DDLC_VENV:-$here/.venv}"
  install_bindings "${DDLC_VENV_TENSORFLOW:-$here/.venv-tf}"
}

check_packages
if [ -z "$source" ] && [ ! -f "$(stamp unpack)" ] && [ ! -f "$cache/$tarball_name" ]; then
  check_sources scorep "$tarball_name=$tarball_sha256"
fi
mkdir -p "$logs"
lock_entry "$prefix"
step unpack
step configure
step make
step install
unlock_entry "$prefix"
rm -f "$(stamp bindings)"   # cheap, and the environments may have been rebuilt
step bindings
say "Score-P $version in $prefix; put $prefix/bin on PATH (ddlc finds it there by itself)"
