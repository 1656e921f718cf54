"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages and an offline site.

on_config writes the command reference and the lessons into build/docs/ (docs/gen.py) and lists them
in the navigation under their index pages; on_files adds them to the site before mkdocs-jupyter looks
for notebooks; on_post_page removes the scripts nbconvert's template loads from a CDN.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

_spec = importlib.util.spec_from_file_location("attnlab_docs_gen", Path(__file__).with_name("gen.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

log = logging.getLogger("mkdocs.hooks.attnlab")

# nbconvert's notebook template loads MathJax and Mermaid from cdnjs; offline they are failed requests.
REMOTE_SCRIPT = re.compile(r"<script[^>]*\ssrc=\"https?://[^\"]*\"[^>]*>\s*</script>", re.I)
REMOTE_IMPORT = re.compile(r"<script type=\"module\">(?:(?!</script>).)*import\(\"https?://.*?</script>", re.I | re.S)


def _fill(nav: list, sections: dict[str, list[tuple[str, str]]]) -> list:
    """The navigation with each generated section's index entry replaced by its pages."""
    filled = []
    for item in nav:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if isinstance(value, list):
                item = {title: _fill(value, sections)}
            elif value in sections:
                item = {title: [{name: page} for name, page in sections[value]]}
        filled.append(item)
    return filled


def on_config(config):
    sections = gen.generate(gen.OUT, log.info)
    config["nav"] = _fill(config["nav"], sections)
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns .ipynb files into pages
def on_files(files, config):
    for path in sorted(p for p in gen.OUT.rglob("*") if p.is_file()):
        uri = path.relative_to(gen.OUT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File(uri, str(gen.OUT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_post_page(output: str, page, config) -> str:
    return REMOTE_IMPORT.sub("", REMOTE_SCRIPT.sub("", output))


def on_post_template(output: str, template_name: str, config) -> str:
    """404.html is a template, not a page: the offline plugin's iframe-worker shim from unpkg goes too."""
    return on_post_page(output, None, config)
