#!/usr/bin/env bash
# End-to-end check of the real terminal app: runs `localfab chat MODEL` in tmux at 100x30 (a tmux
# server of its own) on a stored chat whose title and messages hold terminal escape sequences,
# checks from outside that the terminal's title, clipboard and screen are untouched, waits for
# the model to load, types a message, waits for the reply to stream and for the speed in the
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
# A tmux server of its own: its paste buffers show whether the app wrote the clipboard.
tmux() { command tmux -L "$SESSION" "$@"; }

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

# A stored chat that tries the terminal: its title sets the terminal's title, its user message
# writes the clipboard (OSC 52) and clears the screen (CSI 2J, and C1 CSI), its reply sets the
# title again.
PY=$(dirname "$LOCALFAB")/python
SID=$(LOCALFAB_HOME="$LOCALFAB_HOME" "$PY" - <<'PYEOF'
import os
from localfab.chat.history import History
from localfab.config import default_paths

history = History(default_paths({"LOCALFAB_HOME": os.environ["LOCALFAB_HOME"]}).sessions_db)
sid = history.create_session(model="gemma3:270m")
history.add_message(sid, "user", "hostile \x1b]52;c;cHduZWQ=\x07 one \x1b[2J two \x9b2J three")
history.add_message(sid, "assistant", "reply \x1b]2;PWNED-BY-REPLY\x1b\\ four")
history.rename_session(sid, "\x1b]0;PWNED-BY-TITLE\x07 chat")
history.close()
print(sid)
PYEOF
) || fail "could not store the hostile chat"

# Short replies (64 tokens, no automatic continuation) so the check ends on any model.
tmux new-session -d -s "$SESSION" -x 100 -y 30 \
    "env LOCALFAB_HOME='$LOCALFAB_HOME' LOCALFAB_MAX_TOKENS=64 LOCALFAB_MAX_CONTINUES=0 \
     TERM=xterm-256color '$LOCALFAB' chat '$MODEL' -c 2048 --session $SID; \
     echo localfab-exit=\$?; sleep 30" \
    || fail "could not start tmux"

wait_for "ctx [▰▱]+ [0-9.k]+/[0-9.k]+" "the model to load (context gauge in the status bar)"
echo "tui_check: loaded $MODEL"
wait_for "␛\]2;PWNED-BY-REPLY" "the hostile chat, its escapes shown"
sleep 1
title=$(tmux display-message -p -t "$SESSION" '#{pane_title}')
case "$title" in *PWNED*) fail "the chat set the terminal's title: $title" ;; esac
if [ -n "$(tmux list-buffers 2>/dev/null)" ]; then
    fail "the chat wrote the clipboard: $(tmux list-buffers)"
fi
screen | grep -q "hostile ␛\]52;c;cHduZWQ=␇ one ␛\[2J two ␛\[2J three" \
    || fail "the hostile message is not on the screen as written"
echo "tui_check: a hostile chat left the title ($title), clipboard and screen alone"

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
