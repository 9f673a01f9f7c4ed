# Shared by envs/build-*.sh (sourced).

# checkout OWNER/NAME REF DEST: a fresh tree of REF at DEST, from the local
# copy under $DDLC_SOURCES (<owner>+<name>/repo or <owner>+<name>) when it is
# set, else from GitHub; DEST.commit records the commit.
checkout() {
  local repo=$1 ref=$2 dest=$3 url=https://github.com/$1.git local_copy
  if [[ -n ${DDLC_SOURCES:-} ]]; then
    for local_copy in "$DDLC_SOURCES/${repo/\//+}/repo" "$DDLC_SOURCES/${repo/\//+}"; do
      [[ -d $local_copy ]] && { url=$local_copy; break; }
    done
    if [[ $url == https://* ]]; then
      echo "DDLC_SOURCES=$DDLC_SOURCES has no copy of $repo (expected $DDLC_SOURCES/${repo/\//+}/repo)" >&2
      return 2
    fi
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
