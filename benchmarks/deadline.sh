# Sourced by the bench scripts: DEADLINE_S (seconds from the script's start, unset: none) stops a
# bench in time for its cell to be kept; a stopped bench keeps the repeats it finished.
deadline_started=$(date +%s)
deadline_limit() {  # a bench's own time limit (s) -> the one to run it with; fails when too near
  local limit=$1
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$((DEADLINE_S - ($(date +%s) - deadline_started) - 20))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  [ "$limit" -ge 30 ] && echo "$limit"
}
