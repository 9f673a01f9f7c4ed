#!/usr/bin/env bash
# Gathers every pinned upstream source the build scripts use (envs/sources.txt)
# into one folder, in the layout DDLC_SOURCES reads: <owner>+<name>/repo (a
# bare git mirror, with the submodules the builds check out), Score-P's
# tarball as it is. Run it where the sources can be reached; it needs only
# git (and curl for the tarball), not the harness's environment:
#   ./ddlc sources DIR [tarantella|lbann|scorep ...]   (default: all of them)
# then, on the machine that builds:  DDLC_SOURCES=DIR ./ddlc run
# With DDLC_SOURCES set, it gathers from that folder instead (a part of it,
# for a machine that builds only some frameworks). A second call updates the
# copies. CPython (for Tarantella's Python 3.9, built only where none is
# found) is the largest, about 0.5 GB.
set -euo pipefail
# shellcheck source=envs/build-lib.sh
. "$(dirname "$0")/build-lib.sh"

say() { printf 'sources: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

[[ $# -ge 1 && $1 != -* ]] || die "usage: ./ddlc sources DIR [tarantella|lbann|scorep ...]"
dir=$1; shift
builders=("$@")
for builder in "${builders[@]}"; do
  [[ -n $(pinned_sources "$builder") ]] ||
    die "'$builder': envs/sources.txt pins sources for $(pinned_sources | awk '{print $1}' | sort -u | xargs)"
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export GIT_TERMINAL_PROMPT=0

# Where OWNER/NAME is gathered from.
origin_of() {
  if [[ -n ${DDLC_SOURCES:-} ]]; then
    source_copy "$1" || die "DDLC_SOURCES=$DDLC_SOURCES has no copy of $1 (expected $DDLC_SOURCES/${1/\//+}/repo)"
  else
    echo "https://github.com/$1.git"
  fi
}

# gather_git OWNER/NAME REF [EXTRA]: DIR/<owner>+<name>/repo, a mirror holding
# REF, made in a private folder and renamed into place; then the submodules
# EXTRA names (envs/sources.txt).
gather_git() {
  local repo=$1 ref=$2 extra=${3:-} into=$dir/${1/\//+}/repo from tmp paths=() sub
  from=$(origin_of "$repo")
  if [[ -d $into ]]; then
    say "$repo: updating $into"
    git --git-dir="$into" fetch -q --prune origin || die "$repo: cannot fetch from $from"
  else
    say "$repo: copying from $from"
    mkdir -p "$(dirname "$into")"
    tmp=$(mktemp -d "$into.tmp.XXXXXX")
    git clone -q --mirror "$from" "$tmp" || { rm -rf "$tmp"; die "$repo: cannot copy $from"; }
    mv -T "$tmp" "$into"
  fi
  git --git-dir="$into" rev-parse -q --verify "$ref^{commit}" > /dev/null ||
    die "$repo: $from has no $ref (pinned in envs/sources.txt)"
  case $extra in
    submodules) ;;
    submodules=*) IFS=, read -r -a paths <<< "${extra#submodules=}" ;;
    *) return 0 ;;
  esac
  while read -r sub; do
    [[ -z $sub ]] || gather_git "$sub" HEAD
  done < <(submodule_repos "$into" "$ref" "${paths[@]}")
}

# gather_file NAME SHA256 URL: DIR/NAME, checked against its checksum.
gather_file() {
  local name=$1 sha256=$2 url=$3 tmp
  if [[ -f $dir/$name ]] && echo "$sha256  $dir/$name" | sha256sum -c --quiet - 2> /dev/null; then
    say "$name: already here"; return 0
  fi
  tmp=$(mktemp "$dir/$name.tmp.XXXXXX")
  if [[ -n ${DDLC_SOURCES:-} ]]; then
    say "$name: copying from $DDLC_SOURCES"
    cp "$DDLC_SOURCES/$name" "$tmp" || { rm -f "$tmp"; die "DDLC_SOURCES=$DDLC_SOURCES has no $name"; }
  else
    say "$name: downloading $url"
    curl -fsSL --retry 3 -o "$tmp" "$url" || { rm -f "$tmp"; die "$name: cannot download $url"; }
  fi
  echo "$sha256  $tmp" | sha256sum -c --quiet - 2> /dev/null ||
    { rm -f "$tmp"; die "$name: checksum mismatch (pinned in envs/sources.txt)"; }
  mv "$tmp" "$dir/$name"
}

while read -r builder kind source ref extra; do
  if (( ${#builders[@]} )) && [[ " ${builders[*]} " != *" $builder "* ]]; then continue; fi
  case $kind in
    git) gather_git "$source" "$ref" "$extra" ;;
    file) gather_file "$source" "$ref" "$extra" ;;
  esac
done < <(pinned_sources)
say "ready: DDLC_SOURCES=$dir"
