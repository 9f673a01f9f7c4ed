# Shared by the schedulers' set-up scripts, slurm.sh and oar.sh (sourced, not run).

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

# running PID: the process is there and not a zombie (a daemon that has
# exited stays one until PID 1 reaps it: waiting on its pid alone waited for
# that, about 2 s a daemon here).
running() {
  [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]
}

# stop_one NAME [SIGNAL]: stop the process $dir/run/NAME.pid names (SIGTERM
# unless SIGNAL says otherwise), SIGKILL after 10 s, and forget its PID file.
stop_one() {
  local pidfile=$dir/run/$1.pid pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if running "$pid"; then
    kill "${2:--TERM}" "$pid"
    for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -9 "$pid"
  fi
  rm -f "$pidfile"
}
