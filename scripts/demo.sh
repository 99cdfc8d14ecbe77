#!/bin/sh
# demo.sh BIN MODEL - the main job: a short story from the bundled default model.
set -e
BIN=${1:-build/agentkv}
MODEL=${2:-../shared/models/stories260K.gguf}
if [ ! -f "$MODEL" ]; then
    echo "demo: model $MODEL not found (make demo MODEL=path/to/model.gguf)" >&2
    exit 1
fi
echo "== agentkv run -m $MODEL -p 'Once upon a time' -n 200 --temp 0.8 --seed 42" >&2
"$BIN" run -m "$MODEL" -p "Once upon a time" -n 200 --temp 0.8 --seed 42
