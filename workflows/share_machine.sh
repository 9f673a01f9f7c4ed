# Sourced at the start of every workflow job (the Snakefile's shell prefix):
# the job holds the host-wide measuring lock shared until it ends, so it
# waits while a measurement holds the machine, and no measurement starts
# while it runs (ddlcompare/run/machine_lock.py). A measuring job's command turns
# this same hold exclusive while it measures.
#   source share_machine.sh JOURNAL
# JOURNAL: a file that gets one line per job, "<start> <end> <command>"
# (unix seconds: from the moment the job held the machine to its end), to
# check afterwards that no job ran inside a measured window.
ddlc_lock=${DDLC_MEASURE_LOCK:-/tmp/ddl-compare.measure.lock}
ddlc_journal=$1
ddlc_now() { date +%s.%N; }
ddlc_queued=$(ddlc_now)
ddlc_stop_file() { [ -n "${DDLC_STOP_FILE:-}" ] && [ -e "$DDLC_STOP_FILE" ]; }
ddlc_stop_asked() {
  if ddlc_stop_file; then
    echo "stopped: the workflow was told to stop while this job waited for the machine; it did not start" >&2
    exit 143
  fi
}
# flock in short tries (exit 75: not yet), so that between them a job whose
# workflow was told to stop gives up the wait (75). The caller says why and
# ends (ddlc_stop_asked): here the message could go where the caller sends
# flock's own errors (the turnstile's go to /dev/null).
ddlc_flock() {
  local rc
  while :; do
    rc=0
    flock -E 75 -w 2 "$@" || rc=$?
    [ $rc = 75 ] || return $rc
    ! ddlc_stop_file || return 75
  done
}
if [ -n "${DDLC_MACHINE_HELD:-}" ]; then
  :  # started by a measurement (a bench's workflow): part of it, no lock of its own
elif command -v flock >/dev/null; then
  [ -e "$ddlc_lock" ] || { : >>"$ddlc_lock"; chmod 0666 "$ddlc_lock"; } 2>/dev/null || true
  exec 9<"$ddlc_lock"  # read-only is enough to lock, whoever made the file
  # A measurement waiting for the machine holds the turnstile: queue behind it.
  [ -e "$ddlc_lock.turn" ] || { : >>"$ddlc_lock.turn"; chmod 0666 "$ddlc_lock.turn"; } 2>/dev/null || true
  ddlc_flock -s "$ddlc_lock.turn" true 2>/dev/null || ddlc_stop_asked
  if ! flock -s -n 9; then
    echo "waiting for the machine: a measurement holds $ddlc_lock ($(head -c 200 "$ddlc_lock"))" >&2
    ddlc_flock -s 9 || { ddlc_rc=$?; ddlc_stop_asked; exit $ddlc_rc; }
  fi
  ddlc_stop_asked
else
  echo "warning: no flock command: this job does not wait for measurements (install util-linux)" >&2
fi
ddlc_job_start=$(ddlc_now)
# What a measurement in this job waited for the machine, counting this wait.
export DDLC_JOB_WAITED_S
DDLC_JOB_WAITED_S=$(awk "BEGIN { print $ddlc_job_start - $ddlc_queued }")
mkdir -p "$(dirname "$ddlc_journal")"
# The job's own command: what follows the prefix's last word.
ddlc_job=${BASH_EXECUTION_STRING##*: ddlc-job; }
ddlc_job_ended() {
  printf '%s %s %s\n' "$ddlc_job_start" "$(ddlc_now)" "${ddlc_job//$'\n'/ }" \
    >>"$ddlc_journal" 2>/dev/null || true
}
trap ddlc_job_ended EXIT
