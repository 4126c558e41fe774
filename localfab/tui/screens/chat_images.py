"""Images in the chat: attached by path (`/image PATH`, or a path pasted or dropped on the
prompt), shown as chips above the prompt until the next message takes them, and on that
message; Backspace in an empty prompt takes the last one off."""

from __future__ import annotations

from textual import on, work
from textual.widgets import Static

from localfab.errors import LocalfabError
from localfab.textsafe import visible_controls
from localfab.tui.backend import Attachment, ImageChip, ReadsImages
from localfab.tui.image_paths import read_image
from localfab.tui.screens.chat_parts import ChatHost
from localfab.tui.widgets.messages import image_chips
from localfab.tui.widgets.prompt import PromptBox

NO_IMAGES = (
    "This model reads no images: start it with its vision projector "
    "(localfab chat MODEL --mmproj FILE, or the mmproj-*.gguf beside the model)."
)


class ImageActions(ChatHost):
    """The images waiting to go with the next message."""

    attached: list[tuple[Attachment, str]]

    def reads_images(self) -> bool:
        backend = self.backend
        return isinstance(backend, ReadsImages) and backend.reads_images()

    def attach(self, path: str) -> None:
        """Read and check the image at `path` (in a worker: a file can be large)."""
        if not self.loaded:
            self.notify("Cannot attach: no model is loaded yet.", severity="warning")
            return
        if not self.reads_images():
            self.notify(NO_IMAGES, title="Images", severity="warning", timeout=8)
            return
        self._read_image(path)

    @work(thread=True, group="images", exit_on_error=False)
    def _read_image(self, path: str) -> None:
        try:
            image, label = read_image(path)
        except LocalfabError as exc:
            self.app.call_from_thread(
                self.notify,
                visible_controls(str(exc)),
                title="Image",
                severity="error",
                markup=False,
            )
            return
        self.app.call_from_thread(self._add_image, image, label)

    def _add_image(self, image: Attachment, label: str) -> None:
        self.attached.append((image, label))
        self.show_attached()

    def take_images(self) -> tuple[list[Attachment], tuple[ImageChip, ...]]:
        """The waiting images and their chips, for the message being sent (none wait after)."""
        taken, self.attached = self.attached, []
        self.show_attached()
        return [image for image, _ in taken], tuple(ImageChip(t, i.data) for i, t in taken)

    def show_attached(self) -> None:
        bar = self.query_one("#attachments", Static)
        labels = tuple(label for _, label in self.attached)
        if labels:
            bar.update(image_chips(labels) + "   (Backspace: the last off)")
        bar.set_class(bool(labels), "shown")

    @on(PromptBox.ImagePath)
    def _pasted_image(self, event: PromptBox.ImagePath) -> None:
        self.attach(event.path)

    @on(PromptBox.DropLastImage)
    def _drop_last_image(self) -> None:
        if self.attached:
            _, label = self.attached.pop()
            self.show_attached()
            self.notify(
                f"{visible_controls(label)} taken off.", title="Image", timeout=3, markup=False
            )
