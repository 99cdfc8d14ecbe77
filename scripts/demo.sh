#!/bin/sh
# demo.sh BIN MODEL - the main job: three agents (planner, writer, critic) take
# two phases of turns on the bundled default model; each agent's KV cache is
# quantized (keys q8, values tq3), saved after every turn and restored from disk
# in the next phase (a new process each turn), so phase 2 prefills only the new
# tokens. Then the memory directory is listed.
set -e
BIN=${1:-build/agentkv}
MODEL=${2:-../shared/models/stories260K.gguf}
MEM=${MEM:-build/demo-memory}
if [ ! -f "$MODEL" ]; then
    echo "demo: model $MODEL not found (make demo MODEL=path/to/model.gguf)" >&2
    exit 1
fi
rm -rf "$MEM"
mkdir -p "$MEM"
printf '%-8s %-6s %-7s %-5s %7s %9s %11s  %s\n' agent phase match tier reused prefilled restore_ms continuation
for phase in 1 2; do
    for agent in planner writer critic; do
        case $agent in
            planner) start="Once upon a time, a little girl named Lily made a plan." ;;
            writer) start="Tom and his dog went to the park." ;;
            critic) start="The little bird was sad because" ;;
        esac
        if [ "$phase" = 1 ]; then
            prompt="$start"
        else
            # phase 2 extends what the agent has already seen: its prompt and its answer
            prompt="$start$(cat "$MEM/$agent.out") Then"
        fi
        "$BIN" run -m "$MODEL" --agent "$agent" --memory-dir "$MEM" -ctk q8 -ctv tq3 \
            -p "$prompt" -n 24 --temp 0 >"$MEM/$agent.new" 2>"$MEM/$agent.err"
        line=$(grep '^agent=' "$MEM/$agent.err")
        field() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
        printf '%-8s %-6s %-7s %-5s %7s %9s %11s  %s\n' "$agent" "$phase" "$(field match)" "$(field tier)" \
            "$(field reused)" "$(field prefilled)" "$(field restore_ms)" "$(head -c 60 "$MEM/$agent.new" | tr '\n' ' ')"
        tr -d '\n' < "$MEM/$agent.new" > "$MEM/$agent.out"
    done
done
echo
"$BIN" cache ls --memory-dir "$MEM"
