#!/bin/sh
# run.sh - runs libFuzzer targets for a bounded time each; called by `make fuzz`.
#
#   sh fuzz/run.sh DIR SECONDS NAME...
#
# FUZZ_JOBS=N (environment, default 1) runs N targets at a time, each on one
# core.
#
# For each NAME, DIR/fuzz_NAME runs for SECONDS over its working corpus
# DIR/NAME/ (grown by the run, kept between runs) and its committed seeds
# fuzz/corpus/NAME/ (read only: new inputs go to the first directory).
# Extra libFuzzer flags for a target may be given in fuzz/NAME.options (one
# line, e.g. "-max_len=4096 -dict=fuzz/NAME.dict"); the default input size
# limit is 64 KiB. The whole log is kept as DIR/NAME.log and crash, leak,
# timeout and out-of-memory inputs are written as DIR/NAME-crash-<sha1> etc.
#
# Prints one line per target:
#   fuzz_NAME: ok|FAILED  execs N  exec/s N  cov N  ft N  corpus N  crashes N  (DIR/NAME.log)
# and exits 1 if any target failed (a crash, a sanitizer report, a leak, an
# input slower than the per-input timeout, an out-of-memory), 2 on bad usage.
set -u
if [ $# -lt 3 ]; then
    echo "usage: sh fuzz/run.sh DIR SECONDS NAME..." >&2
    exit 2
fi
dir=$1
secs=$2
shift 2
jobs=${FUZZ_JOBS:-1}

# run_one NAME: fuzzes one target, writes its summary line (and the report's
# first lines when it failed) to DIR/NAME.summary, and DIR/NAME.failed if it
# failed.
run_one() {
    name=$1
    bin=$dir/fuzz_$name
    sum=$dir/$name.summary
    rm -f "$dir/$name.failed"
    if [ ! -x "$bin" ]; then
        echo "fuzz_$name: FAILED  no binary $bin (no fuzz/fuzz_$name.c?)" > "$sum"
        : > "$dir/$name.failed"
        return
    fi
    mkdir -p "$dir/$name"
    seeds=fuzz/corpus/$name
    [ -d "$seeds" ] || seeds=
    opts=
    [ -f "fuzz/$name.options" ] && opts=$(cat "fuzz/$name.options")
    log=$dir/$name.log
    # -timeout: one input running longer than this is a failure (the
    # default, 20 minutes, would never trigger in a short run). The outer
    # timeout bounds a fuzzer that stops answering (e.g. a hang in its
    # startup, before libFuzzer's own clock runs).
    # shellcheck disable=SC2086
    timeout -k 10 $((secs + 120)) "$bin" -max_total_time="$secs" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/$name-" \
        $opts "$dir/$name" $seeds > "$log" 2>&1
    rc=$?
    # libFuzzer's last status line: "#N DONE cov: C ft: F corp: K/..."
    last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1)
    cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(printf '%s\n' "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    # each failing input is written out as an artifact (libFuzzer stops at the first)
    crashes=$(grep -c 'Test unit written to' "$log")
    status=ok
    if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
        status=FAILED
        : > "$dir/$name.failed"
        [ "$crashes" = 0 ] && crashes=1
    fi
    echo "fuzz_$name: $status  execs ${execs:-?}  exec/s ${eps:-?}  cov ${cov:-?}  ft ${ft:-?}  corpus ${corp:-?}  crashes $crashes  ($log)" > "$sum"
    if [ $status = FAILED ]; then
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|^    #[0-9]' "$log" | head -20 | sed 's/^/    /' >> "$sum"
    fi
}

running=0
for name in "$@"; do
    run_one "$name" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait
        running=0
    fi
done
wait
failed=""
for name in "$@"; do
    cat "$dir/$name.summary"
    [ -f "$dir/$name.failed" ] && failed="$failed $name"
done
if [ -n "$failed" ]; then
    echo "fuzz: FAILED:$failed"
    exit 1
fi
exit 0
