"""What `explain()` returns."""
import html


class Explanation(str):
    """The text of `explain()`: a `str`, shown as the text itself where a value is shown (a
    notebook cell's last line, the REPL), once, and as a preformatted block in Jupyter's HTML
    view."""

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        return f"<pre>{html.escape(str(self))}</pre>"
