"""What the browser tests do on a dashboard page, in one place: open a tab, pick a dropdown option."""

from __future__ import annotations


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()


def pick(page, elem_id: str, label_start: str) -> None:
    """Choose the option of Gradio dropdown `#elem_id` whose label starts with `label_start`."""
    box = page.locator(f"#{elem_id} input")
    box.click()
    box.fill(label_start)
    page.locator(f'#{elem_id} [role=option][aria-label^="{label_start}"]').first.click()
