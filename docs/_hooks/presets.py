"""mkdocs hook: fill ``<!-- presets -->`` and ``<!-- settings -->`` in the docs from the
package itself (the preset files' leading comments, the settings dataclasses' help), so the
guide lists exactly the presets and settings the installed ``dpaudit`` has."""

from __future__ import annotations


def _presets() -> str:
    from dpaudit.conf import option_text, preset_groups, preset_names, summary

    rows = ["| preset | what it does | settings it reads |", "|---|---|---|"]
    for name in preset_names("experiment"):
        text = summary(option_text("experiment", name)).replace("|", "\\|")
        reads = ", ".join(f"`{g}`" for g in preset_groups(name)) or "(its own task only)"
        rows.append(f"| `{name}` | {text} | {reads} |")
    return "\n".join(rows)


def _groups() -> str:
    from dpaudit.conf import option_text, preset_names, summary
    from dpaudit.experiment.settings import GROUPS

    lines = []
    for group in GROUPS:
        options = ", ".join(
            f"`{n}` ({summary(option_text(group, n))})" for n in preset_names(group)
        )
        lines.append(f"* `{group}`: {options}")
    return "\n".join(lines)


def _settings() -> str:
    from dpaudit.conf import describe_settings

    return "```text\n" + describe_settings() + "\n```"


def on_page_markdown(markdown: str, **kwargs) -> str:
    for marker, make in (("<!-- presets -->", _presets), ("<!-- groups -->", _groups),
                         ("<!-- settings -->", _settings)):
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
