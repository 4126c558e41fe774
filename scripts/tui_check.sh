#!/usr/bin/env bash
# End-to-end check of the real terminal app: runs `localfab chat MODEL` in tmux at 100x30, waits
# for the model to load, types a message, waits for the reply to stream and for the speed in the
# status bar, then quits with Ctrl+Q. Exits non-zero (and prints the screen) on any failure.
# Usage: scripts/tui_check.sh [MODEL]    (default: gemma3:270m, the built-in test model)
# Environment: LOCALFAB (the command; default .venv/bin/localfab), LOCALFAB_HOME (default: a
# fresh temporary folder), TUI_CHECK_TIMEOUT (seconds per step, default 120).
set -uo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-gemma3:270m}
LOCALFAB=${LOCALFAB:-$PWD/.venv/bin/localfab}
STEP_TIMEOUT=${TUI_CHECK_TIMEOUT:-120}
SESSION="localfab-tui-check-$$"

if ! command -v tmux >/dev/null 2>&1; then
    echo "tui_check: tmux is not installed" >&2
    exit 2
fi
OWN_HOME=""
if [ -z "${LOCALFAB_HOME:-}" ]; then
    LOCALFAB_HOME=$(mktemp -d)
    OWN_HOME=$LOCALFAB_HOME
fi

cleanup() {
    tmux kill-session -t "$SESSION" 2>/dev/null || true
    if [ -n "$OWN_HOME" ]; then rm -rf "$OWN_HOME"; fi
}
trap cleanup EXIT

screen() { tmux capture-pane -p -t "$SESSION" 2>/dev/null; }

fail() {
    echo "tui_check: FAIL: $1" >&2
    echo "--- screen ---" >&2
    screen >&2 || true
    exit 1
}

# wait_for REGEX WHAT: poll the screen until REGEX (extended) matches.
wait_for() {
    local deadline=$((SECONDS + STEP_TIMEOUT))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if ! tmux has-session -t "$SESSION" 2>/dev/null; then
            fail "the app exited while waiting for $2"
        fi
        if screen | grep -Eq "$1"; then
            return 0
        fi
        sleep 0.5
    done
    fail "timed out after ${STEP_TIMEOUT}s waiting for $2"
}

# Short replies (64 tokens, no automatic continuation) so the check ends on any model.
tmux new-session -d -s "$SESSION" -x 100 -y 30 \
    "env LOCALFAB_HOME='$LOCALFAB_HOME' LOCALFAB_MAX_TOKENS=64 LOCALFAB_MAX_CONTINUES=0 \
     TERM=xterm-256color '$LOCALFAB' chat '$MODEL' -c 2048; echo localfab-exit=\$?; sleep 30" \
    || fail "could not start tmux"

wait_for "ctx [▰▱]+ [0-9.k]+/[0-9.k]+" "the model to load (context gauge in the status bar)"
echo "tui_check: loaded $MODEL"

tmux send-keys -t "$SESSION" -l "Write three sentences about the sea."
tmux send-keys -t "$SESSION" Enter
wait_for "Write three sentences about the sea" "the message to show in the chat"
wait_for "[0-9][0-9,]*\.[0-9] tok/s" "the speed in the status bar"
wait_for "[0-9]+ tokens · [0-9,.]+ tok/s · TTFT" "the reply to finish"
speed=$(screen | grep -Eo "[0-9][0-9,]*\.[0-9] tok/s" | head -1)
echo "tui_check: reply streamed; status bar says $speed"

tmux send-keys -t "$SESSION" C-q
wait_for "localfab-exit=[0-9]+" "the app to quit on Ctrl+Q"
if ! screen | grep -q "localfab-exit=0"; then
    fail "the app exited with an error"
fi
echo "tui_check: quit cleanly; OK"
