#!/usr/bin/env bash
# Variants of gpreempt side by side on one machine: one group of run.sh (a cell such as
# compiled) run once per variant per round, the variants' order reversed every other round,
# each variant in a copy of this tree changed by its own command (a patch, a sed, another
# commit's sources), so that a change one run cannot resolve is measured interleaved.
#   OUT=dir ROUNDS=3 bash benchmarks/driver_gate/ab.sh GROUP NAME=COMMAND [NAME=COMMAND ...]
# COMMAND runs in the variant's copy before its first run (':' for the tree as it is), e.g.
#   now=: \
#   nofence="sed -i 's/fence = record_event(g, st.context, stream, false);/fence = nullptr;/' \
#     src/gpreempt/client/gate/csrc/driver_marks.cpp" \
#   old="rm -rf src && tar -xzf old.tgz"   (old.tgz from `git archive -o old.tgz REV src`,
#                                           put in the tree so that it travels with it)
# ROUNDS (default 3); FIRST_ROUND (default 0: the rounds of a run split over several calls
# number on, and their order alternates on); REQUESTS as run.sh's; RUN_S (default 270) the
# seconds one run of the group is given (the compiled cell, 1 repeat, takes 160-240);
# DEADLINE_S (seconds from the start, unset: none) starts no run that would end past it.
# Each run's cell goes to $OUT/NAME/rI/; at the end ab_merge.py combines each variant's rounds into
# $OUT/NAME/results.json (the rounds of several calls' OUTs put together first, where they were
# split), which benchmarks/defaults/table.py prints.
set -u
: "${OUT:?set OUT to an output directory}"
: "${ROUNDS:=3}" "${FIRST_ROUND:=0}" "${RUN_S:=270}"
[ $# -ge 3 ] || { echo "usage: OUT=dir bash $0 GROUP NAME=COMMAND NAME=COMMAND ..." >&2; exit 2; }
group=$1
shift
root=$PWD
copies=${AB_WORK:-/tmp/gpreempt-ab}
source benchmarks/deadline.sh
names=()
for variant in "$@"; do
  name=${variant%%=*}
  command=${variant#*=}
  case $name in
    '' | *[!A-Za-z0-9_.-]*) echo "ab: bad variant name '$name' (letters, digits, . _ -)" >&2; exit 2 ;;
  esac
  rm -rf "${copies:?}/$name"
  mkdir -p "$copies/$name"
  tar -C "$root" --exclude=.git -cf - . | tar -C "$copies/$name" -xf -
  if ! (cd "$copies/$name" && bash -c "$command"); then
    echo "ab: the command of variant $name failed" >&2
    exit 1
  fi
  names+=("$name")
done
for ((round = FIRST_ROUND; round < FIRST_ROUND + ROUNDS; round++)); do
  order=("${names[@]}")
  if ((round % 2)); then  # every other round the other way round
    order=()
    for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
  fi
  for name in "${order[@]}"; do
    limit=$(deadline_limit "$RUN_S") || { echo "ab: DEADLINE_S is near: stopped"; break 2; }
    echo "== round $((round + 1)): $name"
    (cd "$copies/$name" && DEADLINE_S=$limit REPEATS=1 OUT="$OUT/$name/r$round" \
      bash benchmarks/driver_gate/run.sh "$group")
  done
done
# shellcheck disable=SC2046  # one folder per variant, none with spaces
python3 "$root/benchmarks/defaults/table.py" $(PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" \
  python3 "$root/benchmarks/driver_gate/ab_merge.py" "$OUT")
