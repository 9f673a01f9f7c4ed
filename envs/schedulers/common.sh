# Shared by the test schedulers' set-up scripts (sourced, not run).

# Install the Debian packages in "${packages[@]}" that are missing, keeping
# their own daemons stopped: a policy-rc.d saying no, for the install only,
# unless the machine has one.
install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  local policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || {
    [ -n "$policy" ] && rm -f "$policy"; return 1; }
  [ -n "$policy" ] && rm -f "$policy"
  return 0
}
