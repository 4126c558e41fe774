"""Copying from the chat screen: the last reply, or a code block, to the terminal's clipboard
(OSC 52) and the system's (a tool such as wl-copy, in a worker)."""

from __future__ import annotations

from textual import work

from localfab.tui.clipboard import system_copy
from localfab.tui.screens.chat_parts import ChatHost
from localfab.tui.widgets.chat_log import ChatLog


class CopyActions(ChatHost):
    """Copy the last reply or a code block."""

    def action_copy_reply(self) -> None:
        """Copy the last reply, byte-exact (as far as it has streamed)."""
        text = self.query_one(ChatLog).last_reply_text()
        if text is None:
            self.notify("There is no reply to copy yet.", severity="warning")
            return
        self.copy_out(text, "the last reply")

    def action_copy_code(self) -> None:
        """Copy the code block under the mouse or holding the focus, else the last one."""
        code = self.query_one(ChatLog).code_to_copy(self.app.mouse_over, self.focused)
        if code is None:
            self.notify("There is no code block to copy.", severity="warning")
            return
        self.copy_out(code, "the code block")

    def copy_out(self, text: str, what: str) -> None:
        """OSC 52 now; the system clipboard in a worker (a tool may take a moment)."""
        self.app.copy_to_clipboard(text)
        self._system_copy(text, what)

    @work(thread=True, group="copy", exit_on_error=False)
    def _system_copy(self, text: str, what: str) -> None:
        result = system_copy(text)
        message, severity = result.message(what, len(text))
        self.app.call_from_thread(
            self.notify,
            message,
            title="Copy",
            severity=severity,
            timeout=4 if result.tool else 8,
        )
