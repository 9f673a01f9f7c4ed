#!/usr/bin/env bash
# Set up everything ddl-compare needs on Debian 12, idempotently:
#   Debian packages (when root), the main virtual environment (.venv),
#   and Horovod 0.28.1 built against that environment's torch (cached);
#   the TensorFlow environment (.venv-tf) with its own Horovod build (cached).
# Each step is skipped when its result is already there, so a second call
# takes about a second.
#   bash envs/setup.sh                    all of it (./ddlc setup, ./ddlc test)
#   bash envs/setup.sh torch [tensorflow] [tarantella] [tarantella-patched]
#                                         only the environments named, each
#                                         from envs/<name>.txt, Tarantella by
#                                         envs/build-tarantella.sh (how long:
#                                         envs/tarantella.md; ./ddlc run: the
#                                         ones its design needs)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
# shellcheck source=envs/build-lib.sh
. envs/build-lib.sh
cache=$(ddlc_cache_root)
mkdir -p "$cache/wheels"

say() { printf 'setup: %s\n' "$*" >&2; }

# The environments set-up builds, from envs/environments.tsv: each one's
# folder (its variable, else the checkout's folder, else where its build
# script puts it under the cache) and the Debian packages its build needs.
declare -A env_dirs=() env_needs=()
set_up=() by_default=()
while IFS=$'\t' read -r name folder built_in how _ needs; do
  [ "$how" = no ] && continue
  default=$here/$folder
  [ "$built_in" = - ] || default=$cache/$built_in
  variable=$(ddlc_env_variable "$name")
  env_dirs[$name]=${!variable:-$default}
  env_needs[$name]=$needs
  set_up+=("$name")
  [ "$how" = requirements ] && by_default+=("$name")
done < <(ddlc_environments)
[ ${#set_up[@]} -gt 0 ] || { say "error: envs/environments.tsv lists no environment to set up"; exit 2; }
# Tarantella's build script takes its folders from DDLC_TARANTELLA_PREFIX
# and DDLC_TARANTELLA_PATCHED_PREFIX.
[ -n "${DDLC_VENV_TARANTELLA:-}" ] || env_dirs[tarantella]=${DDLC_TARANTELLA_PREFIX:-${env_dirs[tarantella]}}
[ -n "${DDLC_VENV_TARANTELLA_PATCHED:-}" ] ||
  env_dirs[tarantella-patched]=${DDLC_TARANTELLA_PATCHED_PREFIX:-${env_dirs[tarantella-patched]}}
venv=${env_dirs[torch]} venv_tf=${env_dirs[tensorflow]}
wanted=("$@")
[ $# -gt 0 ] || wanted=("${by_default[@]}")
for name in "${wanted[@]}"; do
  if [ -z "${env_dirs[$name]+set}" ]; then
    listed=$(printf '%s, ' "${set_up[@]:0:${#set_up[@]}-1}")
    say "envs/setup.sh sets up ${listed%, } and ${set_up[-1]}, not '$name'$(
      [ -f "envs/build-$name.sh" ] && echo ": 'bash envs/build-$name.sh' builds it")"
    exit 2
  fi
done
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# ENV TOOL COMMAND...: COMMAND (pip or uv), with its chatter in a log that is
# shown only when it fails: in the environment, which is this checkout's own
# (the cache is shared).
logged_in() {
  local env=$1 tool=$2 log=$1/.ddlc-$2.log; shift 2
  "$@" > "$log" 2>&1 ||
    { tail -n 30 "$log" >&2; say "$tool failed in $env; full log: $log"; exit 1; }
}

pip_in() { logged_in "$1" pip "$1/bin/python" -m pip "${@:2}"; }

# Each environment's packages come from a folder of wheels in the cache,
# fetched once by pip with this machine's pip settings (its indexes,
# find-links and constraints: where torch's CPU build comes from), so that a
# set-up after the first resolves nothing against an index and needs no
# network. uv (envs/installer.txt, its binary kept in the folder) installs
# from it, linking each file from its own cache ($cache/uv) where pip
# unzipped every package anew: seconds instead of a minute. Where the indexes
# have no uv, pip installs from the same wheels.

# wheels_of REQUIREMENTS: its folder of wheels (a cache entry, one per
# requirements file, installer, Python, machine and pip settings).
wheels_of() {
  local key
  key=$( (cat "$1" envs/installer.txt; python3 -c 'import sys; print(sys.version)'; uname -m
          env | grep '^PIP_' | sort
          cat /etc/pip.conf /etc/xdg/pip/pip.conf "${XDG_CONFIG_HOME:-$HOME/.config}/pip/pip.conf" \
              "$HOME/.pip/pip.conf" ${PIP_CONFIG_FILE:+"$PIP_CONFIG_FILE"} 2>/dev/null || true) |
        sha256sum | cut -c1-12)
  echo "$cache/wheels/$(basename "$1" .txt)-$key"
}

# fetch_wheels PYTHON REQUIREMENTS INSTALLER OUT: the wheels of REQUIREMENTS
# (and of pip, each environment's own) into OUT, uv's binary beside them.
fetch_wheels() {
  local python=$1 requirements=$2 installer=$3 out=$4
  "$python" -m pip wheel -r "$requirements" pip -w "$out"
  if "$python" -m pip download --no-deps --only-binary :all: -r "$installer" -d "$out/.uv"; then
    "$python" -m zipfile -e "$out"/.uv/uv-*.whl "$out/.uv/unpacked"
    install -m 755 "$out"/.uv/unpacked/uv-*.data/scripts/uv "$out/uv"
  fi
  rm -rf "$out/.uv"
}

# install_in ENV WHEELS ARGS...: ARGS (pip install's) into ENV from WHEELS
# alone, by uv where WHEELS holds it. Compiled by compileall, not here. Our
# own packages are built with --no-build-isolation: with the environment's
# setuptools (both requirements files list it, for Horovod's build), 2 s
# against 5 s in a build environment of their own.
install_in() {
  local env=$1 wheels=$2; shift 2
  if [ -x "$wheels/uv" ]; then
    logged_in "$env" uv env UV_CACHE_DIR="$cache/uv" UV_NO_CONFIG=1 \
      "$wheels/uv" pip install -q --offline --no-index --find-links "$wheels" --python "$env/bin/python" "$@"
  else
    pip_in "$env" install -q --no-compile --no-index --find-links "$wheels" "$@"
  fi
}

# otf2-print: the tests check our OTF2 archives and the readers against it.
# chromium: the report test opens the report in it.
# libopen-trace-format2-dev: the OTF2 C library the fast trace reader (traces/fastotf2) uses.
# iproute2: ip and tc, which build the emulated slow network (ddlcompare/run/netem.py).
# protobuf-compiler: protoc compiles LBANN's .proto files for its front end (frameworks/lbann_source.py).
debian_packages=(openmpi-bin libopenmpi-dev dataset-fashion-mnist cmake g++ make python3-dev python3-venv
                 otf2-tools chromium libopen-trace-format2-dev iproute2 protobuf-compiler)

# What each wanted environment's build needs (envs/environments.tsv; for
# Tarantella: GPI-2's autotools, and gawk, which gaspi_run needs, since mawk
# fails with "Not enough hosts").
for name in "${wanted[@]}"; do
  # shellcheck disable=SC2206  # needs: words
  [ "${env_needs[$name]}" = - ] || debian_packages+=(${env_needs[$name]})
done

missing_packages() {
  local p
  for p in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s ' "$p"
  done
}

# Two set-ups at once on a fresh machine: apt-get refuses at once (exit 100)
# while another apt-get holds its locks (DPkg::Lock::Timeout waits for the
# dpkg lock, not for apt-get update's lists lock). So set-ups take turns on a
# lock of their own, the second saying for whom it waits, and look again
# once they hold it: the first has usually installed everything. (The lock
# is in the cache, which fresh checkouts share.)
DEBIAN_LOCK=$cache/debian-packages.lock

install_debian_packages() {
  local missing
  missing=$(missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    say "missing Debian packages; run: sudo apt-get install -y ${missing% }"
    exit 1
  fi
  exec {apt_lock}>>"$DEBIAN_LOCK"
  if ! flock -n "$apt_lock"; then
    say "waiting for another set-up's Debian packages ($(cat "$DEBIAN_LOCK" 2>/dev/null || true))"
    flock "$apt_lock"
  fi
  lock_holder > "$DEBIAN_LOCK"
  missing=$(missing_packages)
  if [ -n "$missing" ]; then
    say "installing Debian packages: ${missing% }"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    # shellcheck disable=SC2086  # missing: package names, one a word
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends $missing >/dev/null
  fi
  : > "$DEBIAN_LOCK"
  exec {apt_lock}>&-
}

# A virtual environment from a requirements file, with this checkout installed
# in it (editable, no dependencies). Rebuilt when the file, pyproject.toml (its
# packages: an editable install finds only those it was made with) or the
# checkout's path changes (the stamp holds their hash).
build_env() {
  env_current "$1" "$2" && return 0
  env_packages "$@"
  env_checkout "$1" "$2"
}

env_stamp() {  # ENV REQUIREMENTS: what the environment's stamp must say
  # "bytecode" stands for this recipe: environments made before it was
  # byte-compiled are made again.
  (sha256sum "$2" pyproject.toml; echo "$here bytecode") | sha256sum | cut -d' ' -f1
}

env_current() { [ -f "$1/.ddlc-requirements" ] && [ "$(cat "$1/.ddlc-requirements")" = "$(env_stamp "$1" "$2")" ]; }

# ENV REQUIREMENTS LABEL: the environment and its packages, byte-compiled.
env_packages() {
  local env=$1 requirements=$2 label=$3 start=$SECONDS wheels
  check_owner "$env"
  wheels=$(wheels_of "$requirements")
  if [ -x "$wheels/uv" ] && entry_stamped "$wheels"; then
    say "building the $label environment in $env (about a minute, from the wheels in $wheels)"
    [ -x "$env/bin/python" ] || python3 -m venv --without-pip "$env"  # uv installs pip
  else
    say "building the $label environment in $env (a minute or two)"
    [ -x "$env/bin/python" ] || python3 -m venv "$env"
    "$env/bin/python" -m pip --version > /dev/null 2>&1 || python3 -m venv "$env"  # one made without pip
    pip_in "$env" install -q --upgrade pip
    cache_entry "$wheels" entry_stamped fetch_wheels "$env/bin/python" "$here/$requirements" \
      "$here/envs/installer.txt" || {
      tail -n 30 "$(find "$wheels.logs" -type f | sort | tail -n 1)" >&2
      say "pip could not fetch the $label environment's packages (above; log in $wheels.logs/): can it reach the package index?"
      exit 1
    }
  fi
  # Installed without compiling (pip compiled one file at a time: half of
  # torch's install here, 59 s against 26 s); compileall does it on every core. It must be done here:
  # where PYTHONDONTWRITEBYTECODE is set (this project's CI machines set it),
  # Python never writes what it compiles, and every process that imports
  # torch compiled its thousands of modules again (7 s an import against
  # 3 s; the suite took 47 minutes instead of 30). Files that do not compile
  # (some packages ship templates and fixtures named .py) are skipped, as
  # pip skips them.
  # --upgrade: the wheels' versions, also of what the environment holds
  # already (venv's own setuptools 65, which cannot build this checkout)
  install_in "$env" "$wheels" --upgrade -r "$requirements" pip
  # The packages' own test suites (pandas', sympy's, scipy's...: a quarter of
  # the files) are left out: nothing here imports them.
  "$env/bin/python" -m compileall -q -j 0 -x 'site-packages/.*/tests/' \
    "$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    > "$env/.ddlc-compileall.log" 2>&1 || true
  say "the $label environment's packages installed in $(duration $((SECONDS - start)))"
}

# ENV REQUIREMENTS: this checkout installed in it (editable), then stamped.
env_checkout() {
  install_in "$1" "$(wheels_of "$2")" --no-deps --no-build-isolation -e .
  env_stamp "$1" "$2" > "$1/.ddlc-requirements"
}

# An environment holds one checkout's editable install. Two checkouts that
# share one (DDLC_VENV, a symlinked .venv) would re-point it at whichever set
# up last, each then running the other's code: refused, unless the other
# checkout is gone or DDLC_TAKE_OVER_ENV=1. An environment inside this
# checkout (a copy of another's included) is this checkout's own.
check_owner() {
  local env=$1 owner place url
  # No record (a fresh checkout: no environment yet) is no owner; under
  # pipefail the failed cat would otherwise end set-up without a word.
  url=$( { cat "$env"/lib/python3*/site-packages/ddl_compare-*.dist-info/direct_url.json 2>/dev/null || true; } |
        sed -n 's#.*"url": *"file://\([^"]*\)".*#\1#p' | head -n 1)
  owner=${url:-$here}; place=$(realpath "$env")
  [ "$(realpath "$owner" 2>/dev/null || echo "$owner")" != "$(realpath "$here")" ] && [ -d "$owner" ] &&
    [[ $place != "$(realpath "$here")"/* ]] || return 0
  if [ "${DDLC_TAKE_OVER_ENV:-0}" = 1 ]; then
    say "$env: taken over from the checkout $owner (DDLC_TAKE_OVER_ENV=1); it runs this checkout's code now"
    return 0
  fi
  say "error: $env is the environment of the checkout $owner; setting it up here would re-point it at $here, and $owner would run this checkout's code. Give this checkout its own environment (unset DDLC_VENV, or remove the .venv link), or take it over with DDLC_TAKE_OVER_ENV=1"
  exit 2
}

# The probes below read what is installed without importing torch or
# TensorFlow (5 s an import on a loaded machine, three of them a set-up).
# installed_torch NAME: a variable of torch/version.py (__version__, cuda).
installed_torch() {
  "$venv/bin/python" -c 'import importlib.util as u, os, runpy, sys
where = u.find_spec("torch").submodule_search_locations[0]
print(runpy.run_path(os.path.join(where, "version.py")).get(sys.argv[1]) or "")' "$1"
}

# has_horovod ENV: Horovod is installed in ENV (only set-up installs it: the
# wheel built against that environment's framework).
has_horovod() { "$1/bin/python" -c 'import importlib.metadata as m; m.version("horovod")' 2>/dev/null; }

# GPU machines: torch from PyPI is a CUDA build there, and Horovod needs
# NCCL for device: gpu. It is built with NCCL (torch's own nvidia-nccl
# package) when nvcc is on PATH; without nvcc it is built for CPUs and the
# horovod-torch adapter refuses device: gpu, saying how to rebuild.
# Prints the extra build variables, nothing on a CPU-only torch.
horovod_gpu_build_env() {
  local cuda nccl
  cuda=$(installed_torch cuda)
  [ -n "$cuda" ] || return 0
  if ! command -v nvcc >/dev/null; then
    say "torch is a CUDA $cuda build but nvcc is not on PATH: Horovod is built without NCCL" >&2
    return 0
  fi
  nccl=$("$venv/bin/python" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl" ] && [ ! -e "$nccl/lib/libnccl.so" ]; then
    ln -s libnccl.so.2 "$nccl/lib/libnccl.so"  # the wheel ships only the versioned name
  fi
  echo "HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")" \
       "${nccl:+HOROVOD_NCCL_HOME=$nccl HOROVOD_NCCL_LINK=SHARED}"
}

# A Horovod wheel's cache entry (envs/build-lib.sh: cache_entry) is whole
# when stamped, or when it is a folder holding the wheel: entries published
# before the stamp existed were renamed into place only once built.
wheel_whole() {
  entry_stamped "$1" && return 0
  [[ -d $1 && ! -L $1 ]] && compgen -G "$1/horovod-*.whl" > /dev/null
}

# timed LABEL COMMAND...: runs COMMAND; when it took over 20 s (it built
# something, or waited for another set-up's build), says how long.
timed() {
  local label=$1 start=$SECONDS rc=0; shift
  "$@" || rc=$?
  (( rc != 0 || SECONDS - start <= 20 )) || say "$label: ready in $(duration $((SECONDS - start)))"
  return "$rc"
}

# horovod_wheel PYTHON PATCH_CXX17 [VAR=VALUE...] OUT: builds Horovod
# 0.28.1's wheel with PYTHON (its environment's framework) into OUT.
horovod_wheel() {
  local python=$1 cxx17=$2 out=${!#} src
  set -- "${@:3:$# - 3}"
  src=$out/.src
  mkdir -p "$src"
  "$python" -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$src"
  tar -xzf "$src"/horovod-0.28.1.tar.gz -C "$src"
  if [[ $cxx17 = yes ]]; then
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
      "$src/horovod-0.28.1/CMakeLists.txt" "$src/horovod-0.28.1/horovod/torch/CMakeLists.txt"
  fi
  # Its build type, RelWithDebInfo, compiles with full debug information
  # (-g): -g1 keeps the line tables (py-spy's native frames still name
  # Horovod's lines: ddlcompare/run/stacks.py) at a fifth less compile time
  # (7.0 s of CPU against 5.6 s for horovod/common/operations.cc).
  sed -i 's/string(REPLACE "-O2" "-O3" \(CMAKE_C\(XX\)\{0,1\}_FLAGS_RELWITHDEBINFO\)/string(REPLACE "-O2 -g" "-O3 -g1" \1/' \
    "$src/horovod-0.28.1/CMakeLists.txt"
  (cd "$src/horovod-0.28.1" &&
    env "$@" PATH="/usr/bin:$PATH" HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_MXNET=1 \
      MAKEFLAGS="-j$(nproc)" "$python" -m pip wheel -q --no-build-isolation --no-cache-dir --no-deps -w "$out" .)
  rm -rf "$src"
}

# Horovod 0.28.1 only builds against torch 2.13 with C++17; the wheel is
# cached per Python and torch version so a fresh clone reuses it.
install_horovod() {
  has_horovod "$venv" && return 0
  local py torch wheel_dir gpu_env
  py=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
  torch=$(installed_torch __version__); torch=${torch%%+*}
  gpu_env=$(horovod_gpu_build_env)
  wheel_dir="$cache/wheels/horovod-0.28.1-torch$torch-$py${gpu_env:+-nccl}"
  wheel_whole "$wheel_dir" ||
    say "building Horovod 0.28.1 against torch $torch (a few minutes, cached in $wheel_dir)"
  # shellcheck disable=SC2086  # gpu_env: VAR=VALUE words
  timed "Horovod (torch)" cache_entry "$wheel_dir" wheel_whole horovod_wheel "$venv/bin/python" yes \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 $gpu_env ||
    { say "Horovod build failed; log: $wheel_dir.logs/"; exit 1; }
  install_in "$venv" "$(wheels_of envs/torch.txt)" --no-deps "$wheel_dir"/horovod-*.whl
}

# The TensorFlow environment: its own venv, because TensorFlow 2.12 needs
# numpy < 2. Rebuilt when envs/tensorflow.txt or the repository path changes
# (the editable install points at this checkout).

# Horovod 0.28.1 with TensorFlow (Gloo and MPI controllers), cached per
# Python and TensorFlow version. Debian's cmake (3.25): pip's cmake 4 rejects
# Gloo's CMakeLists.
install_horovod_tf() {
  has_horovod "$venv_tf" && return 0
  local py tf wheel_dir
  py=$("$venv_tf/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
  tf=$("$venv_tf/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
  wheel_dir="$cache/wheels/horovod-0.28.1-tf$tf-$py"
  wheel_whole "$wheel_dir" ||
    say "building Horovod 0.28.1 against TensorFlow $tf (about 10 minutes, cached in $wheel_dir)"
  timed "Horovod (TensorFlow)" cache_entry "$wheel_dir" wheel_whole horovod_wheel "$venv_tf/bin/python" no \
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 ||
    { say "Horovod (TensorFlow) build failed; log: $wheel_dir.logs/"; exit 1; }
  install_in "$venv_tf" "$(wheels_of envs/tensorflow.txt)" --no-deps "$wheel_dir"/horovod-*.whl
}

# The C reader of OTF2 traces and the C scanner of Kineto JSON, cached per
# source hash (~1 s each to build).
build_fastotf2() {
  "$venv/bin/python" -m traces.fastotf2 >/dev/null
  "$venv/bin/python" -m traces.fastjson >/dev/null
}

# Score-P, where envs/build-scorep.sh built it on this machine: its Python
# bindings go into these environments too, so a fresh checkout (CI on a
# machine that has the build) traces with it and runs its real tests.
# Elsewhere nothing happens: tracer scorep is then refused, naming the script.
add_scorep_bindings() {
  [[ -x $cache/scorep-8.4/bin/scorep ]] || return 0
  local name missing=no
  for name in "${wanted[@]}"; do
    [ "$name" = tarantella ] && continue  # Score-P cannot trace gaspi_run's ranks
    "${env_dirs[$name]}/bin/python" -c 'import scorep' 2>/dev/null || missing=yes
  done
  [ $missing = yes ] || return 0
  say "Score-P is built in $cache/scorep-8.4: adding its Python bindings"
  local log=$venv/.ddlc-scorep-bindings.log
  bash "$here/envs/build-scorep.sh" 2> "$log" ||
    say "Score-P's bindings failed (log: $log); scorep runs stay refused"
}

install_debian_packages
# build_tarantella PREFIX [patched]: Tarantella (or the build with our patch)
# in PREFIX. Stamped per part: seconds when it is built (envs/tarantella.md:
# how long when not). One log per attempt; fd 3 brings its notices (a wait
# for another checkout's build, sources it cannot reach) to this terminal.
build_tarantella() {
  local prefix=$1 variant=${2:-} log rc=0
  mkdir -p "$prefix.logs"
  log=$prefix.logs/$(date -u +%Y%m%dT%H%M%SZ)-$$.log
  DDLC_TARANTELLA_PREFIX=$prefix DDLC_TARANTELLA_PATCHED_PREFIX=$prefix \
    bash envs/build-tarantella.sh $variant 3>&2 > "$log" 2>&1 || rc=$?
  case $rc in
    0) ;;
    3) exit 2 ;;  # its sources cannot be had: it said so, with the ways out
    *) tail -n 20 "$log" >&2; say "Tarantella's build${variant:+ ($variant)} failed; log: $log"; exit 1 ;;
  esac
}
# Tarantella's builds take nothing from the other environments: they run
# beside them, from the start (on 2 cores the pip installs, the configure
# steps and the checks of one side leave a core to the other's compiler).
# Their sources are checked first, in seconds, so that a missing one stops
# set-up at once; the builds themselves run one after the other.
tarantella_builds=
tarantella_variants=()
if wants tarantella; then tarantella_variants+=(""); fi
if wants tarantella-patched; then tarantella_variants+=(patched); fi
for variant in ${tarantella_variants[@]+"${tarantella_variants[@]}"}; do
  prefix=${env_dirs[tarantella${variant:+-$variant}]}
  DDLC_TARANTELLA_PREFIX=$prefix DDLC_TARANTELLA_PATCHED_PREFIX=$prefix \
    bash envs/build-tarantella.sh $variant --check-sources || exit 2
done
if [ ${#tarantella_variants[@]} -gt 0 ]; then
  (
    for variant in "${tarantella_variants[@]}"; do
      build_tarantella "${env_dirs[tarantella${variant:+-$variant}]}" $variant
    done
  ) &
  tarantella_builds=$!
  trap wait EXIT  # leaving early (another build failed): it ends first, never half-way
fi
# The TensorFlow environment's packages install beside the main environment's
# build: pip unpacks and writes one file at a time, so two at once use both
# cores. The two editable installs of this checkout take turns (both write
# its .egg-info).
tf_packages=
if wants tensorflow && ! env_current "$venv_tf" envs/tensorflow.txt; then
  env_packages "$venv_tf" envs/tensorflow.txt TensorFlow &
  tf_packages=$!
  trap wait EXIT  # leaving early (the main build failed): it ends first, never half-way
fi
if wants torch; then
  build_env "$venv" envs/torch.txt Python
  # This checkout's own packages, byte-compiled as the environment's are:
  # where PYTHONDONTWRITEBYTECODE is set, every command compiled them anew
  # (0.06-0.09 s of CPU of each `ddlc import`). An edited module is compiled
  # again in memory, as always; these are only a head start.
  "$venv/bin/python" -m compileall -q -j 0 runfiles ddlcompare frameworks traces analysis front \
    > "$venv/.ddlc-compileall-checkout.log" 2>&1 || true
  # The OAR executor plugin of profiles/grid5000: a package of ours, installed as a user would.
  install_in "$venv" "$(wheels_of envs/torch.txt)" --no-deps --no-build-isolation ./plugins/snakemake-executor-plugin-oar
  # The upstream Slurm plugin of profiles/slurm, with our patch: a Ctrl-C
  # cancels every job of the workflow (envs/patches/slurm-plugin). Applied
  # each time (a no-op once there): pip's reinstall would undo it.
  "$venv/bin/python" envs/patches/apply.py envs/patches/slurm-plugin/cancel.json \
    "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/snakemake_executor_plugin_slurm" \
    > /dev/null || { say "the Slurm plugin's patch no longer applies (envs/torch.txt's version?)"; exit 1; }
  build_fastotf2
  install_horovod
fi
if wants tensorflow; then
  if [ -n "$tf_packages" ]; then
    wait "$tf_packages" || exit $?  # it said why
    env_checkout "$venv_tf" envs/tensorflow.txt
  fi
  install_horovod_tf
fi
if [ -n "$tarantella_builds" ]; then
  wait "$tarantella_builds" || exit $?  # it said why
fi
add_scorep_bindings
ready=()
for name in "${wanted[@]}"; do ready+=("${env_dirs[$name]}"); done
say "ready: ${ready[*]}"
