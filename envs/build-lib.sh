# Shared by envs/build-*.sh, envs/setup.sh and envs/sources.sh (sourced).

# The one folder of every cache, computed as runfiles/variables.py's
# cache_root does (tests/test_variables.py holds the two together).
ddlc_cache_root() { printf '%s\n' "${DDLC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddl-compare}"; }

# The framework environments' table (envs/environments.tsv, which
# ddlcompare/plan/envs.py reads too): its rows, without the comments and the
# header, as "name folder built_in setup build needs", tab-separated.
ddlc_environments() {
  grep -v '^#' "$(dirname "${BASH_SOURCE[0]}")/environments.tsv" | tail -n +2
}

# The variable that names an environment's folder: DDLC_VENV for torch,
# DDLC_VENV_<NAME> for the others (ddlcompare/plan/envs.py's variable).
ddlc_env_variable() {
  if [ "$1" = torch ]; then echo DDLC_VENV; else echo "DDLC_VENV_$(tr 'a-z-' 'A-Z_' <<< "$1")"; fi
}

# A line for the person at the terminal: on fd 3 when the caller opened it
# (envs/setup.sh does, while the build's own output goes to its log), and on
# stderr (the log).
notice() {
  if { true >&3; } 2>/dev/null; then printf '%s\n' "$*" >&3; fi
  printf '%s\n' "$*" >&2
}

# duration SECONDS: "3 min 5 s" (or "42 s"), for the lines that say how long a step took.
duration() {
  if (( $1 >= 60 )); then echo "$(( $1 / 60 )) min $(( $1 % 60 )) s"; else echo "$1 s"; fi
}

# --- pinned sources (envs/sources.txt) ---------------------------------------

ddlc_envs=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# pinned_sources [BUILDER]: the lines of envs/sources.txt (of BUILDER), as
# "builder kind source ref extra".
pinned_sources() {
  grep -v -e '^#' -e '^[[:space:]]*$' "$ddlc_envs/sources.txt" | awk -v b="${1:-}" 'b == "" || $1 == b'
}

# pin SOURCE: its ref (or sha256) as envs/sources.txt pins it.
pin() {
  local ref
  ref=$(pinned_sources | awk -v s="$1" '$3 == s {print $4}')
  [[ -n $ref ]] || { echo "envs/sources.txt pins no $1" >&2; return 2; }
  echo "$ref"
}

# source_copy OWNER/NAME: its local copy under $DDLC_SOURCES, if any.
source_copy() {
  local copy
  for copy in "$DDLC_SOURCES/${1/\//+}/repo" "$DDLC_SOURCES/${1/\//+}"; do
    [[ -d $copy ]] && { echo "$copy"; return 0; }
  done
  return 1
}

# submodule_repos GITDIR REF [PATH...]: the GitHub repositories of the
# submodules of REF (those at PATH... when given), one OWNER/NAME a line.
submodule_repos() {
  local gitdir=$1 ref=$2 key url path; shift 2
  git --git-dir="$gitdir" show "$ref:.gitmodules" > /dev/null 2>&1 || return 0
  while read -r key url; do
    path=$(git --git-dir="$gitdir" config --blob "$ref:.gitmodules" "${key%.url}.path")
    if (( $# )) && [[ " $* " != *" $path "* ]]; then continue; fi
    url=${url#https://github.com/}; url=${url%.git}; url=${url%/}
    echo "$url"
  done < <(git --git-dir="$gitdir" config --blob "$ref:.gitmodules" --get-regexp '^submodule\..*\.url$')
}

# source_problem SOURCE REF [EXTRA]: nothing when SOURCE can be had at REF
# (its copy under $DDLC_SOURCES holds REF, and the submodules EXTRA names;
# without DDLC_SOURCES, GitHub answers within 15 s); else what is wrong.
source_problem() {
  local source=$1 ref=$2 extra=${3:-} copy gitdir sub paths=()
  if [[ $source == *.tar.gz ]]; then  # a file: ref is its sha256, extra its URL
    if [[ -n ${DDLC_SOURCES:-} ]]; then
      [[ -f $DDLC_SOURCES/$source ]] || echo "DDLC_SOURCES=$DDLC_SOURCES has no $source"
    elif ! curl -sfI --max-time 15 -o /dev/null "$extra"; then
      echo "$extra cannot be reached"
    fi
    return 0
  fi
  if [[ -z ${DDLC_SOURCES:-} ]]; then
    GIT_TERMINAL_PROMPT=0 timeout 15 git ls-remote "https://github.com/$source.git" HEAD > /dev/null 2>&1 ||
      echo "https://github.com/$source cannot be reached"
    return 0
  fi
  copy=$(source_copy "$source") ||
    { echo "DDLC_SOURCES=$DDLC_SOURCES has no copy of $source (expected $DDLC_SOURCES/${source/\//+}/repo)"; return 0; }
  gitdir=$(git -C "$copy" rev-parse --absolute-git-dir 2>/dev/null) ||
    { echo "$copy is not a git copy of $source"; return 0; }
  git --git-dir="$gitdir" rev-parse -q --verify "$ref^{commit}" > /dev/null ||
    { echo "$copy has no $ref of $source"; return 0; }
  case $extra in
    submodules) ;;
    submodules=*) IFS=, read -r -a paths <<< "${extra#submodules=}" ;;
    *) return 0 ;;
  esac
  while read -r sub; do
    [[ -z $sub ]] || source_copy "$sub" > /dev/null ||
      echo "DDLC_SOURCES=$DDLC_SOURCES has no copy of $sub (a submodule of $source; expected $DDLC_SOURCES/${sub/\//+}/repo)"
  done < <(submodule_repos "$gitdir" "$ref" "${paths[@]}")
}

# check_sources WHO SOURCE=REF...: before a build starts, stops it (exit 3)
# within seconds, in one line, when one of its sources cannot be had, naming
# both ways out. The first problem is enough to say what to do.
check_sources() {
  local who=$1 item source ref extra problem; shift
  for item in "$@"; do
    source=${item%%=*}; ref=${item#*=}
    extra=$(pinned_sources | awk -v s="$source" '$3 == s {print $5}')
    problem=$(source_problem "$source" "$ref" "$extra")
    [[ -z $problem ]] && continue
    notice "$who: cannot build: $problem. Gather every source with './ddlc sources DIR' on a machine that reaches them, then set DDLC_SOURCES=DIR here; or drop $who from the design's framework levels."
    exit 3
  done
}

# --- shared cache entries ----------------------------------------------------
# Other checkouts on this machine share the cache: an entry is built in a
# private folder beside it and published by one rename, under a lock on the
# entry (flock on ENTRY.lock), so a second set-up waits for the first and then
# uses what it built.

# The holder of a lock, written into the lock file for those who wait: for
# display only, nothing acts on it.
lock_holder() {
  printf 'pid %s on %s, checkout %s, since %s\n' "$$" "$(hostname)" "$(pwd)" "$(date -u +%FT%TZ)"
}

# lock_entry ENTRY: takes ENTRY.lock (on fd $entry_lock_fd; one entry at a
# time per process), first saying whom it waits for when another holds it.
lock_entry() {
  local lock=$1.lock
  mkdir -p "$(dirname "$1")"
  exec {entry_lock_fd}>>"$lock"
  if ! flock -n "$entry_lock_fd"; then
    notice "$(basename "$0"): waiting for $1, which another set-up is building ($(cat "$lock" 2>/dev/null || true))"
    flock "$entry_lock_fd"
  fi
  lock_holder > "$lock"
}

unlock_entry() {
  : > "$1.lock"
  flock -u "$entry_lock_fd"
  exec {entry_lock_fd}>&-
}

ENTRY_STAMP=.ddlc-complete

# entry_stamped ENTRY: a folder (not a file, not a link) with its completion stamp.
entry_stamped() { [[ -d $1 && ! -L $1 && -f $1/$ENTRY_STAMP ]]; }

# cache_entry ENTRY IS_WHOLE BUILD...: makes sure ENTRY is whole (IS_WHOLE
# ENTRY says so; entry_stamped for most). Else, under its lock, removes what
# is there (a file where the folder belongs, a partial build) and the private
# folders of attempts that were cut off, runs BUILD... PRIVATE_FOLDER with its
# output in ENTRY.logs/<time>-<pid>.log (one per attempt), stamps the folder
# and renames it to ENTRY. BUILD is a command or a function; it sees the
# exported variables only.
cache_entry() {
  local entry=$1 is_whole=$2 tmp log rc=0; shift 2
  "$is_whole" "$entry" && return 0
  lock_entry "$entry"
  if ! "$is_whole" "$entry"; then
    rm -rf "$entry".tmp.*  # only the lock's holder builds: these were cut off
    if [[ -e $entry || -L $entry ]]; then
      notice "$(basename "$0"): $entry is damaged (not a folder, or no completion stamp): building it again"
      rm -rf "$entry"
    fi
    tmp=$(mktemp -d "$entry.tmp.XXXXXX")
    mkdir -p "$entry.logs"
    log=$entry.logs/$(date -u +%Y%m%dT%H%M%SZ)-$$.log
    # In a bash of its own, given this shell's functions: there set -e holds
    # even where the caller runs cache_entry as a condition (cache_entry ||
    # ...), which turns it off for every function it calls.
    bash -euo pipefail -c "$(declare -f); \"\$@\"" cache-build "$@" "$tmp" > "$log" 2>&1 || rc=$?
    if (( rc == 0 )); then
      date -u +%FT%TZ > "$tmp/$ENTRY_STAMP"
      mv -T "$tmp" "$entry"
    else
      rm -rf "$tmp"
    fi
  fi
  unlock_entry "$entry"
  (( rc == 0 )) || { notice "$(basename "$0"): building $entry failed; log: $log"; return "$rc"; }
}

# checkout OWNER/NAME REF DEST: a fresh tree of REF at DEST, from the local
# copy under $DDLC_SOURCES (<owner>+<name>/repo or <owner>+<name>) when it is
# set, else from GitHub; DEST.commit records the commit.
checkout() {
  local repo=$1 ref=$2 dest=$3 url=https://github.com/$1.git
  if [[ -n ${DDLC_SOURCES:-} ]]; then
    url=$(source_copy "$repo") || {
      echo "DDLC_SOURCES=$DDLC_SOURCES has no copy of $repo (expected $DDLC_SOURCES/${repo/\//+}/repo)" >&2
      return 2
    }
  fi
  rm -rf "$dest"
  git clone -q --no-checkout "$url" "$dest"
  git -C "$dest" -c advice.detachedHead=false checkout -q "$ref"
  git -C "$dest" rev-parse HEAD > "$dest.commit"
}

# submodules DEST [PATH...]: check out DEST's git submodules (only those at
# PATH... when given), from their local copies under $DDLC_SOURCES when it is
# set (a build that runs `git submodule update` itself, as Aluminum's CMake
# does, then finds them there).
submodules() {
  local dest=$1 key url repo; shift
  [[ -f $dest/.gitmodules ]] || return 0
  git -C "$dest" submodule init -q "$@"
  if [[ -n ${DDLC_SOURCES:-} ]]; then
    while read -r key url; do
      repo=${url#https://github.com/}
      repo=${repo%.git}
      git -C "$dest" config "${key}" "$DDLC_SOURCES/${repo/\//+}/repo"
    done < <(git -C "$dest" config -f .gitmodules --get-regexp '^submodule\..*\.url$')
  fi
  git -C "$dest" -c protocol.file.allow=always submodule update -q "$@"
}

# missing_debian_packages PKG...: prints those of PKG not installed (nothing
# where dpkg-query is not there: a cluster brings them as modules).
missing_debian_packages() {
  command -v dpkg-query >/dev/null || return 0
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf '%s ' "$p"
  done
}
